// AEGIS dashboard: keeps the server-rendered page live from /api/live (server-sent events) and
// draws the charts with uPlot (vendored). No build step; DOM is built with textContent only.
(function () {
  "use strict";

  const CFG = JSON.parse(document.getElementById("aegis-config").textContent);
  const T = CFG.labels;
  const page = document.body.dataset.page;
  const KST = "Asia/Seoul";
  const GLYPH = { NORMAL: "✓", WARNING: "▲", CRITICAL: "✖", UNKNOWN: "?" };
  const PALETTE = ["#4cc9f0", "#f4a261", "#90be6d", "#f72585", "#b5a3ff", "#ffd166", "#43aa8b", "#ef476f"];
  const charts = (window.AEGIS_CHARTS = {});

  // -- small helpers ------------------------------------------------------------------------

  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") el.className = v;
      else if (k === "dataset") Object.assign(el.dataset, v);
      else el.setAttribute(k, v === true ? "" : String(v));
    }
    for (const c of children.flat()) {
      if (c === null || c === undefined || c === false) continue;
      el.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return el;
  }

  const kstFmt = new Intl.DateTimeFormat("sv-SE", {
    timeZone: KST, year: "numeric", month: "2-digit", day: "2-digit",
    hour: "2-digit", minute: "2-digit", second: "2-digit", hour12: false,
  });

  function parseTs(s) {
    if (!s) return null;
    const d = new Date(s);
    return isNaN(d.getTime()) ? null : d;
  }

  function timeTag(iso) {
    const d = parseTs(iso);
    if (!d) return h("span", {}, "–");
    const utc = d.toISOString().replace(/\.\d{3}Z$/, "Z");
    return h("time", { datetime: utc, title: utc + " UTC", "data-ts": utc }, kstFmt.format(d) + " KST");
  }

  function ageText(seconds) {
    if (seconds < 0) seconds = 0;
    let v;
    if (seconds < 90) v = Math.round(seconds) + (CFG.lang === "ko" ? "초" : " s");
    else if (seconds < 5400) v = Math.round(seconds / 60) + (CFG.lang === "ko" ? "분" : " min");
    else v = Math.round(seconds / 3600) + (CFG.lang === "ko" ? "시간" : " h");
    return v + " " + T.ago;
  }

  function freshness(age) {
    if (age === null || age >= CFG.offlineAfterS) return "offline";
    return age >= CFG.staleAfterS ? "stale" : "fresh";
  }

  // numbers as the server renders them: at most two decimals, thousands separated
  function num(v) {
    return Number(Number(v).toFixed(2)).toLocaleString("en-US");
  }

  function badge(level) {
    const lv = level || "UNKNOWN";
    return h("span", { class: "badge lv-" + lv.toLowerCase(), "data-level": lv },
      h("span", { class: "glyph", "aria-hidden": "true" }, GLYPH[lv] || "?"),
      h("span", { class: "lv-text" }, T[lv] || lv));
  }

  function freshChip(state) {
    return h("span", { class: "chip fresh-" + state, "data-fresh": state, hidden: state === "fresh" },
      h("span", { "aria-hidden": "true" }, state === "stale" ? "⏸" : "⊘"), " ",
      state === "stale" ? T.stale : T.offline);
  }

  function ageSpan(at) {
    return h("span", { class: "age", "data-at": at || "" }, timeTag(at));
  }

  async function getJSON(url) {
    const resp = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } });
    if (resp.status === 401) { toLogin(); throw new Error("unauthorized"); }
    if (!resp.ok) throw new Error(url + ": " + resp.status);
    return resp.json();
  }

  function toLogin() {
    location.assign("/login?next=" + encodeURIComponent(location.pathname + location.search));
  }

  // -- clock and freshness, every second -------------------------------------------------------

  function tick() {
    const clock = document.getElementById("clock");
    if (clock) {
      const now = new Date();
      clock.textContent = kstFmt.format(now).slice(11) + " KST";
      clock.title = now.toISOString().replace(/\.\d{3}Z$/, "Z") + " UTC";
    }
    document.querySelectorAll(".age[data-at]").forEach(refreshAge);
    refreshSince();
  }

  // "12 s ago" and the stale/offline chip of one freshness element
  function refreshAge(el) {
    const d = parseTs(el.dataset.at);
    const age = d ? (Date.now() - d.getTime()) / 1000 : null;
    if (d) {
      const tag = el.querySelector("time");
      if (tag) tag.textContent = ageText(age);
    }
    const holder = el.closest("[data-factory]");
    const chip = el.parentElement.querySelector(".chip[data-fresh]");
    const state = freshness(age);
    if (chip && chip.dataset.fresh !== state) chip.replaceWith(freshChip(state));
    if (holder) holder.dataset.fresh = state;
  }

  // -- fleet ------------------------------------------------------------------------------------

  function reasonItems(reasons, limit) {
    const list = (reasons || []).slice(0, limit || 99);
    if (!list.length) return [h("li", { class: "muted" }, T.no_reasons)];
    return list.map((r) => h("li", { class: "sev-" + String(r.severity || "").toLowerCase() },
      h("code", {}, r.code), " ", h("span", {}, r.detail || "")));
  }

  function score(value) {
    return h("span", { class: "score", "aria-label": T.score },
      h("span", { class: "num" }, value === null || value === undefined ? "–" : Math.round(value)),
      h("span", { class: "unit" }, "/100"));
  }

  function tile(e) {
    const lv = (e.level || "UNKNOWN").toLowerCase();
    const age = e.age_s === null || e.age_s === undefined ? null : e.age_s;
    return h("a", { class: "tile lv-" + lv, href: "/factories/" + encodeURIComponent(e.factory_id),
      dataset: { factory: e.factory_id, level: e.level || "UNKNOWN", updated: e.updated_at || "" } },
      h("div", { class: "tile-head" }, h("span", { class: "fid" }, e.factory_id), badge(e.level)),
      score(e.score),
      h("ul", { class: "reasons", "aria-label": T.reasons }, reasonItems(e.reasons, 4)),
      h("div", { class: "tile-foot" }, ageSpan(e.last_factory_state_at), " ", freshChip(freshness(age)), " ",
        h("span", { class: "pipe", title: T.pipeline }, e.pipeline_status || "–")));
  }

  function newer(el, entry) {
    // latest wins: an event older than what is shown is ignored
    return !el || !el.dataset.updated || !entry.updated_at || entry.updated_at >= el.dataset.updated;
  }

  function putTile(entry, known) {
    const grid = document.getElementById("fleet");
    if (!grid) return;
    const old = known || grid.querySelector('#fleet > [data-factory="' + CSS.escape(entry.factory_id) + '"]');
    if (!newer(old, entry)) return;
    const el = tile(entry);
    if (old) old.replaceWith(el);
    else {
      grid.querySelector(".empty")?.remove();
      const after = [...grid.children].find((t) => t.classList.contains("tile") && t.dataset.factory > entry.factory_id);
      grid.insertBefore(el, after || null);
    }
    el.querySelectorAll(".age[data-at]").forEach(refreshAge);
    scheduleCounts();
  }

  // the summary is counted once per frame, however many tiles changed in it (500 factories)
  let countsPending = false;
  function scheduleCounts() {
    if (countsPending) return;
    countsPending = true;
    requestAnimationFrame(() => { countsPending = false; counts(); });
  }

  function counts() {
    const c = { CRITICAL: 0, WARNING: 0, NORMAL: 0 };
    document.querySelectorAll("#fleet .tile").forEach((t) => { if (t.dataset.level in c) c[t.dataset.level]++; });
    for (const [lv, n] of Object.entries(c)) {
      const b = document.querySelector('[data-count="' + lv + '"]');
      if (b) b.textContent = n;
    }
  }

  function onFleet(data) {
    const grid = document.getElementById("fleet");
    if (!grid) return;
    const seen = new Set();
    const shown = new Map([...grid.querySelectorAll(".tile")].map((t) => [t.dataset.factory, t]));
    for (const e of data.factories) { seen.add(e.factory_id); putTile(e, shown.get(e.factory_id)); }
    shown.forEach((t, fid) => { if (!seen.has(fid)) t.remove(); });
    counts();
  }

  // -- alerts and cloud ---------------------------------------------------------------------

  function onAlerts(data) {
    const list = document.getElementById("alerts");
    if (!list) return;
    const scope = list.dataset.scope;
    const rows = (data.alerts || []).filter((a) => !scope || a.scope === scope);
    list.replaceChildren(...(rows.length ? rows.map((a) => {
      const sev = String(a.severity || "WARNING");
      const href = a.scope === "cloud-infra" ? "/cloud" : "/factories/" + encodeURIComponent(a.scope);
      return h("li", { class: "alert sev-" + sev.toLowerCase(), dataset: { scope: a.scope } },
        badge(sev), " ", scope ? null : h("a", { href, class: "scope" }, a.scope), " ",
        h("code", { class: "code" }, a.reason), " ",
        h("span", { class: "muted" }, T.since + " ", timeTag(a.fired_at)));
    }) : [h("li", { class: "muted" }, list.dataset.empty)]));
  }

  let cloudTimer = null;
  function onCloud(data) {
    const holder = document.getElementById("cloud-overall");
    const latest = data.latest || {};
    if (holder) {
      const b = badge(latest.overall_status);
      const old = holder.querySelector(".badge");
      if (old) old.replaceWith(b); else holder.append(b);
    }
    if (page === "cloud") {
      clearTimeout(cloudTimer);  // spread the screens' reads over a few seconds
      cloudTimer = setTimeout(loadCloud, Math.random() * 3000);
    }
  }

  // -- factory detail -------------------------------------------------------------------------

  function onFactory(data) {
    const entry = data.entry;
    putTile(entry);
    const head = document.getElementById("factory");
    if (!head || head.dataset.factory !== entry.factory_id || !newer(head, entry)) return;
    head.dataset.level = entry.level || "UNKNOWN";
    head.dataset.updated = entry.updated_at || "";
    head.className = head.className.replace(/\blv-\w+/, "lv-" + (entry.level || "unknown").toLowerCase());
    head.querySelector(".fh-level .badge").replaceWith(badge(entry.level));
    head.querySelector(".fh-level .score").replaceWith(score(entry.score));
    head.querySelector(".fh-reasons .reasons").replaceChildren(...(entry.reasons || []).length
      ? entry.reasons.map((r) => h("li", { class: "sev-" + String(r.severity || "").toLowerCase() },
        badge(r.severity), " ", h("code", {}, r.code), " ", h("span", {}, r.detail || "")))
      : [h("li", { class: "muted" }, T.no_reasons)]);
    const age = head.querySelector(".facts .age");
    age.replaceWith(ageSpan(entry.last_factory_state_at));
    head.querySelector(".facts .pipe").textContent = entry.pipeline_status || "–";
    head.querySelector(".facts .updated").replaceChildren(timeTag(entry.updated_at));
    if (currentWindow() === "1h") appendPoint(data.latest);
    const snap = data.latest.latest_image_snapshot;
    if (snap && snap.s3_key !== shownImage) loadImage();
    tick();
  }

  function currentWindow() {
    const c = document.getElementById("charts");
    return c ? c.dataset.window : null;
  }

  let shownImage = null;
  async function loadImage() {
    const box = document.getElementById("camera");
    if (!box) return;
    const data = await getJSON("/api/factories/" + encodeURIComponent(CFG.factoryId) + "/images/latest");
    const img = data.image;
    if (!img) { box.replaceChildren(h("p", { class: "muted" }, T.no_image)); return; }
    shownImage = img.s3_key;
    box.replaceChildren(
      h("img", { src: img.url, alt: T.camera + " " + (img.camera_id || ""), loading: "lazy" }),
      h("p", { class: "muted small" }, (img.camera_id || "") + " · ", timeTag(img.captured_at)));
  }

  // series extraction: 1h = HISTORY#STATE items (LATEST snapshots), 6h+ = GRAPH#5M items
  function seriesOf(items, windowName) {
    const raw = windowName === "1h";
    const xs = [], risk = { score: [], mean: [] }, sensors = {}, ai = {}, infra = {};
    const names = { sensors: new Set(), ai: new Set(), infra: new Set() };
    const rows = items.map((it) => {
      if (raw) {
        const fs = it.factory_state || {}, inf = it.infra_state || {};
        const det = {};
        for (const d of fs.detections || []) det[d.label] = Math.max(det[d.label] || 0, d.confidence);
        const figs = Object.assign({}, inf.host || {}, inf.network || {});
        return { at: it.updated_at, score: (it.risk || {}).score, mean: null,
          sensors: fs.sensors || {}, ai: det, infra: figs };
      }
      const st = it.stats || {};
      const pick = (o, f) => Object.fromEntries(Object.entries(o || {}).map(([k, v]) => [k, v[f]]));
      return { at: it.bucket_start || st.window_start, score: (st.risk || {}).max_score,
        mean: (st.risk || {}).mean_score, sensors: pick(st.sensors, "avg"),
        ai: pick(st.detections, "max_confidence"), infra: pick(st.infra, "avg") };
    }).filter((r) => parseTs(r.at));
    for (const r of rows) {
      for (const k of Object.keys(r.sensors)) names.sensors.add(k);
      for (const k of Object.keys(r.ai)) names.ai.add(k);
      for (const [k, v] of Object.entries(r.infra)) if (typeof v === "number" && k !== "uptime_s") names.infra.add(k);
    }
    for (const r of rows) {
      xs.push(parseTs(r.at).getTime() / 1000);
      risk.score.push(r.score ?? null);
      risk.mean.push(r.mean ?? null);
      for (const k of names.sensors) (sensors[k] = sensors[k] || []).push(r.sensors[k] ?? null);
      for (const k of names.ai) (ai[k] = ai[k] || []).push(r.ai[k] ?? (raw ? 0 : null));
      for (const k of names.infra) (infra[k] = infra[k] || []).push(r.infra[k] ?? null);
    }
    return { raw, xs, risk, sensors, ai, infra };
  }

  const AXIS = { stroke: "#9aa4b2", grid: { stroke: "#252c3a", width: 1 }, ticks: { stroke: "#252c3a" } };
  const hm = new Intl.DateTimeFormat("en-GB", { timeZone: KST, hour: "2-digit", minute: "2-digit", hour12: false });
  const md = new Intl.DateTimeFormat("en-GB", { timeZone: KST, month: "2-digit", day: "2-digit" });
  // x axis in KST, 24-hour clock; the date under the first tick and where the day changes
  const hms = new Intl.DateTimeFormat("en-GB", { timeZone: KST, hour: "2-digit", minute: "2-digit", second: "2-digit", hour12: false });
  function kstTicks(u, splits, axisIdx, foundSpace, foundIncr) {
    let lastDay = null;
    const fmt = foundIncr < 60 ? hms : hm;  // seconds when the ticks are less than a minute apart
    return splits.map((ts) => {
      const d = new Date(ts * 1000), day = md.format(d);
      const label = fmt.format(d) + (day !== lastDay ? "\n" + day : "");
      lastDay = day;
      return label;
    });
  }

  function makeChart(id, el, title, xs, named, opts) {
    if (charts[id]) { charts[id].destroy(); delete charts[id]; }
    const keys = Object.keys(named);
    const width = Math.max(240, el.clientWidth || 600);
    const series = [{}].concat(keys.map((k, i) => ({
      label: k, stroke: PALETTE[i % PALETTE.length], width: 2, spanGaps: !opts.points,
      points: { show: !!opts.points, size: 5 },
    })));
    const u = new uPlot({
      title, width, height: opts.height || 180,
      tzDate: (ts) => uPlot.tzDate(new Date(ts * 1e3), KST),
      scales: { x: { time: true }, y: opts.range ? { range: opts.range } : {} },
      axes: [Object.assign({ values: kstTicks, size: 50, space: 80 }, AXIS), Object.assign({ size: 50 }, AXIS)],
      legend: { live: true },
      series,
    }, [xs].concat(keys.map((k) => named[k])), el);
    charts[id] = u;
    return u;
  }

  let chartData = null;
  async function loadHistory(windowName) {
    const box = document.getElementById("charts");
    if (!box) return;
    box.dataset.window = windowName;
    box.setAttribute("aria-busy", "true");
    document.querySelectorAll(".win").forEach((a) => {
      if (a.dataset.window === windowName) a.setAttribute("aria-current", "true");
      else a.removeAttribute("aria-current");
    });
    const data = await getJSON("/api/factories/" + encodeURIComponent(CFG.factoryId) + "/history?window=" + windowName);
    if (currentWindow() !== windowName) return;  // switched again meanwhile
    chartData = seriesOf(data.items, windowName);
    if (windowName === "1h") chartData.items = data.items.slice();  // live appends go here
    drawCharts();
    box.removeAttribute("aria-busy");
  }

  function emptyNote(el) {
    el.replaceChildren(h("p", { class: "muted nodata" }, T.no_data));
  }

  function drawCharts() {
    const d = chartData;
    const riskEl = document.getElementById("chart-risk");
    const empty = !d.xs.length;
    for (const id of Object.keys(charts)) { charts[id].destroy(); delete charts[id]; }
    if (empty) {
      ["chart-risk", "chart-sensors", "chart-ai", "chart-infra"].forEach((i) => emptyNote(document.getElementById(i)));
      return;
    }
    riskEl.replaceChildren();
    const riskSeries = d.raw ? { [T.score]: d.risk.score } : { max: d.risk.score, mean: d.risk.mean };
    makeChart("risk", riskEl, "", d.xs, riskSeries, { range: [0, 100] });
    const sensorsEl = document.getElementById("chart-sensors");
    sensorsEl.replaceChildren();
    const sensorNames = Object.keys(d.sensors).sort();
    if (!sensorNames.length) emptyNote(sensorsEl);
    for (const name of sensorNames) {
      const cell = h("div", { class: "small-multiple" });
      sensorsEl.append(cell);
      makeChart("sensor:" + name, cell, name, d.xs, { [name]: d.sensors[name] }, { height: 150 });
    }
    const aiEl = document.getElementById("chart-ai");
    aiEl.replaceChildren();
    if (Object.keys(d.ai).length) makeChart("ai", aiEl, "", d.xs, d.ai, { range: [0, 1], points: true });
    else emptyNote(aiEl);
    const infraEl = document.getElementById("chart-infra");
    infraEl.replaceChildren();
    if (Object.keys(d.infra).length) makeChart("infra", infraEl, "", d.xs, d.infra, {});
    else emptyNote(infraEl);
  }

  function appendPoint(latest) {
    if (!chartData || !chartData.raw || !latest || !latest.updated_at) return;
    const x = parseTs(latest.updated_at).getTime() / 1000;
    if (chartData.xs.length && x <= chartData.xs[chartData.xs.length - 1]) return;
    // a LATEST is the next HISTORY#STATE item: add it and drop what left the hour
    const items = chartData.items || [];
    items.push(latest);
    const cutoff = Date.now() / 1000 - 3600;
    chartData = Object.assign(seriesOf(items.filter((i) => parseTs(i.updated_at).getTime() / 1000 >= cutoff), "1h"), { items });
    drawCharts();
  }

  function setupFactory() {
    const box = document.getElementById("charts");
    document.querySelectorAll(".win").forEach((a) => a.addEventListener("click", (ev) => {
      ev.preventDefault();
      const w = a.dataset.window;
      const url = new URL(location.href);
      url.searchParams.set("window", w);
      history.replaceState(null, "", url);
      loadHistory(w).catch(console.error);
    }));
    loadHistory(box.dataset.window).catch(console.error);
    loadImage().catch(console.error);
    let resizeTimer = null;
    new ResizeObserver(() => {
      clearTimeout(resizeTimer);
      resizeTimer = setTimeout(() => { if (chartData) drawCharts(); }, 200);
    }).observe(box);
  }

  // -- cloud page --------------------------------------------------------------------------------

  // a check's status as the server renders it (incident_macros.check_status): starting and
  // pending (failing, not yet for its for duration) instead of the NORMAL badge; firing and
  // clearing beside the reported level
  function checkStatus(c) {
    const al = c.alerting || {};
    const parts = [];
    if (c.status === "NORMAL" && (al.state === "starting" || al.state === "pending")) {
      parts.push(h("span", { class: "badge al-badge al-" + al.state, "data-level": "NORMAL", "data-alerting": al.state },
        h("span", { class: "glyph", "aria-hidden": "true" }, al.state === "starting" ? "◌" : "◔"),
        h("span", { class: "lv-text" }, T["al_" + al.state])));
    } else {
      parts.push(badge(c.status));
    }
    if (c.reason !== "OK") parts.push(" ", h("code", {}, c.reason));
    if (["pending", "firing", "clearing"].includes(al.state)) {
      const note = h("div", { class: "al-note al-" + al.state, "data-alerting": al.state });
      if (al.state !== "pending") note.append(h("span", { class: "al-state" }, T["al_" + al.state]), " ");
      const muted = (...xs) => note.append(h("span", { class: "muted" }, ...xs), " ");
      if (al.state === "clearing") {
        if (al.passing_since) muted(T.al_passing_since + " ", timeTag(al.passing_since));
        if (al.clear_s) muted("· " + T.al_cleared_after + " " + durationText(al.clear_s));
      } else {
        if (al.failing_since) muted(T.al_failing_since + " ", timeTag(al.failing_since));
        if (al.state === "pending" && al.for_s) muted("· " + T.al_reported_after + " " + durationText(al.for_s));
      }
      parts.push(note);
    }
    return parts;
  }

  async function loadCloud() {
    const data = await getJSON("/api/cloud");
    for (const tier of ["fast", "slow"]) {
      const byCheck = {};
      for (const item of data[tier] || []) {
        for (const c of ((item.snapshot || {}).checks || [])) {
          (byCheck[c.name] = byCheck[c.name] || []).push({ at: item.updated_at, status: c.status, reason: c.reason });
        }
      }
      document.querySelectorAll('[data-strip^="' + tier + ':"]').forEach((cell) => {
        const name = cell.dataset.strip.slice(tier.length + 1);
        const runs = (byCheck[name] || []).slice(-72);
        cell.replaceChildren(h("span", { class: "strip-runs", role: "img",
          "aria-label": runs.filter((r) => r.status !== "NORMAL").length + " / " + runs.length },
          runs.map((r) => {
            const d = parseTs(r.at);
            const when = d ? kstFmt.format(d) + " KST (" + d.toISOString().slice(0, 19) + "Z UTC)" : "";
            return h("span", { class: "run lv-" + String(r.status).toLowerCase(), title: when + " " + r.status + " " + r.reason });
          })));
      });
    }
    const latest = data.latest;
    if (latest && document.getElementById("cloud")) {
      // statuses of the rendered rows, so the table follows each run without a reload
      for (const tier of ["fast", "slow"]) {
        for (const c of ((latest[tier] || {}).checks || [])) {
          const row = document.querySelector('[data-tier="' + tier + '"] tr[data-check="' + CSS.escape(c.name) + '"]');
          if (!row) continue;
          row.className = "lv-" + c.status.toLowerCase();
          row.dataset.alerting = (c.alerting || {}).state || "ok";
          row.children[1].replaceChildren(...checkStatus(c));
          row.children[2].textContent = c.value === null || c.value === undefined ? "–" : num(c.value) + " " + (c.unit || "");
        }
      }
    }
  }


  // -- incidents: the list, a factory's banners, Acknowledge and Resolve ---------------------
  // The rows are rendered by the server (the same template as the first load) and read again
  // from /incidents/list whenever an incident changes (the live stream's "incident" event: the
  // dispatcher's changes, acknowledgements in Slack or on any dashboard), and every
  // CFG.incidentsRefreshS while the page is visible, for what a screen missed. A row is replaced
  // only when its version changed, keeping an open timeline and a note being typed.

  // "how long open" counts on the server's clock: the offset of this browser's clock from it
  let serverSkew = 0;
  function setSkew(iso) {
    const d = parseTs(iso);
    if (d) serverSkew = d.getTime() - Date.now();
  }

  // as pages.duration writes it: 45 s, 12 min, 5 h 3 min, 3 d 4 h
  function durationText(seconds) {
    const s = Math.max(0, Math.floor(seconds));
    const ko = CFG.lang === "ko";
    const part = (n, u) => ko ? n + { s: "초", min: "분", h: "시간", d: "일" }[u] : n + " " + u;
    if (s < 60) return part(s, "s");
    if (s < 3600) return part(Math.floor(s / 60), "min");
    if (s < 48 * 3600) {
      const m = Math.floor(s / 60);
      return part(Math.floor(m / 60), "h") + (m % 60 ? " " + part(m % 60, "min") : "");
    }
    const hrs = Math.floor(s / 3600);
    return part(Math.floor(hrs / 24), "d") + (hrs % 24 ? " " + part(hrs % 24, "h") : "");
  }

  function refreshSince() {
    const now = Date.now() + serverSkew;
    document.querySelectorAll(".since[data-since]").forEach((el) => {
      const d = parseTs(el.dataset.since);
      if (d) el.textContent = durationText((now - d.getTime()) / 1000);
    });
  }

  const STATE_GLYPH = { triggered: "●", acknowledged: "◐", resolved: "○" };
  function stateChip(state) {
    return h("span", { class: "state state-" + state, "data-state": state },
      h("span", { class: "glyph", "aria-hidden": "true" }, STATE_GLYPH[state] || "?"), " ",
      T["state_" + state] || state);
  }

  function ackLine(inc) {
    if (!inc.acknowledged_by) return [h("span", { class: "muted" }, T.not_acknowledged)];
    return [h("span", { class: "who" }, inc.acknowledged_by), " · ", timeTag(inc.acknowledged_at),
      inc.acknowledged_via ? " · " + T.via + " " + inc.acknowledged_via : ""];
  }

  function say(row, kind, text, extra) {
    const out = row.querySelector(".outcome");
    if (!out) return;
    out.dataset.kind = kind;
    out.replaceChildren(text, ...(extra ? [" ", extra] : []));
  }

  function signInLink() {
    return h("a", { href: "/login?next=" + encodeURIComponent(location.pathname + location.search) }, T.sign_in_again);
  }

  // what the API answered, shown in the row at once (the next read brings the new timeline)
  function showIncident(row, inc) {
    row.dataset.state = inc.state;
    // replaced by the server's row at the next read that has this version (a read already under
    // way when the answer came may bring the one before: it is not taken)
    row.dataset.version = "";
    row.dataset.atLeast = inc.version;
    row.className = row.className.replace(/\bst-\w+/, "st-" + inc.state);
    row.querySelector(".state")?.replaceWith(stateChip(inc.state));
    row.querySelector(".acked")?.replaceChildren(...ackLine(inc));
    if (inc.state !== "triggered") row.querySelectorAll('form[data-action="ack"]').forEach((f) => f.remove());
    if (inc.state === "resolved") row.querySelectorAll("form[data-action]").forEach((f) => f.remove());
  }

  // a card resolved here stays this long after the answer, whatever the reads in between
  // bring, so that the person reads what happened; the first read after it takes it away
  const KEEP_RESOLVED_MS = 10000;
  function keepAWhile(row) {
    row.dataset.keepUntil = String(Date.now() + KEEP_RESOLVED_MS);
    setTimeout(refreshIncidents, KEEP_RESOLVED_MS + 250);
  }

  function closedHere(row) {
    // it leaves the list a moment later (keepAWhile); until then it says what happened
    keepAWhile(row);
    row.dataset.state = "resolved";
    row.dataset.version = "";
    row.dataset.atLeast = Number.MAX_SAFE_INTEGER;  // no read brings it back open
    row.className = row.className.replace(/\bst-\w+/, "st-resolved");
    row.querySelector(".state")?.replaceWith(stateChip("resolved"));
    row.querySelectorAll("form[data-action]").forEach((f) => f.remove());
  }

  async function onIncidentSubmit(ev) {
    const form = ev.target.closest && ev.target.closest("form[data-action]");
    const row = form && form.closest("[data-incident]");
    if (!row) return;
    ev.preventDefault();
    const action = form.dataset.action;
    const input = form.elements.namedItem("note");
    const note = input ? input.value.trim() : "";
    if (action === "resolve" && !note) {
      input.setAttribute("aria-invalid", "true");
      say(row, "error", T.note_required);
      input.focus();
      return;
    }
    input?.removeAttribute("aria-invalid");
    const buttons = [...row.querySelectorAll("form[data-action] button")];
    buttons.forEach((b) => { b.disabled = true; });
    say(row, "busy", T.saving);
    let resp = null, body = null;
    try {
      resp = await fetch("/api/incidents/" + encodeURIComponent(row.dataset.incident) + "/" + action, {
        method: "POST",
        credentials: "same-origin",
        headers: { "Content-Type": "application/json", Accept: "application/json" },
        body: JSON.stringify(note ? { note } : {}),
      });
      body = await resp.json().catch(() => null);
    } catch (err) {
      resp = null;
    } finally {
      buttons.forEach((b) => { b.disabled = false; });
    }
    if (resp === null) return say(row, "error", T.err_network);
    if (resp.status === 401) return say(row, "error", T.err_signed_out, signInLink());
    if (resp.status === 409) { closedHere(row); return say(row, "error", T.err_resolved); }
    if (resp.status === 404) { closedHere(row); return say(row, "error", T.err_unknown_incident); }
    if (!resp.ok || !body || !body.incident) return say(row, "error", T.err_failed.replace("{status}", resp.status));
    const inc = body.incident;
    showIncident(row, inc);
    if (inc.state === "resolved") keepAWhile(row);
    if (input) input.value = "";
    if (action === "ack") {
      const who = inc.acknowledged_by || "";
      say(row, "ok", (body.changed ? T.done_ack : T.already_ack).replace("{who}", who));
    } else {
      say(row, "ok", T.done_resolve.replace("{who}", inc.resolved_by || ""));
    }
    scheduleIncidents();  // a full period from now: the answer stays readable until then
  }

  // a row read again: keep what the person is doing in the one it replaces
  function carryOver(prev, next) {
    const open = prev.querySelector("details.timeline")?.open;
    if (open) next.querySelector("details.timeline")?.setAttribute("open", "");
    prev.querySelectorAll("form[data-action]").forEach((f) => {
      const to = next.querySelector('form[data-action="' + f.dataset.action + '"]');
      const from = f.elements.namedItem("note");
      if (to && from && from.value) to.elements.namedItem("note").value = from.value;
    });
    const said = prev.querySelector(".outcome");
    const out = next.querySelector(".outcome");
    if (said && out && said.childNodes.length) {
      out.dataset.kind = said.dataset.kind || "";
      out.replaceChildren(...said.childNodes);
    }
  }

  function mergeIncidents(box, fresh) {
    const shown = new Map([...box.querySelectorAll(":scope > [data-incident]")].map((el) => [el.dataset.incident, el]));
    const rows = [];
    let focus = null;
    for (const row of fresh.querySelectorAll(":scope > [data-incident]")) {
      const prev = shown.get(row.dataset.incident);
      shown.delete(row.dataset.incident);
      const stale = prev && Number(row.dataset.version) < Number(prev.dataset.atLeast || 0);
      if (prev && (stale || prev.dataset.version === row.dataset.version)) { rows.push(prev); continue; }
      const next = document.importNode(row, true);
      if (prev) {
        carryOver(prev, next);
        const active = document.activeElement;
        if (active && prev.contains(active) && active.name === "note") {
          const form = active.closest("form[data-action]");
          focus = next.querySelector('form[data-action="' + form.dataset.action + '"] input[name="note"]');
        }
        prev.replaceWith(next);
      }
      rows.push(next);
    }
    shown.forEach((el) => {  // resolved, or archived: gone, unless resolved here just now
      if (Number(el.dataset.keepUntil || 0) <= Date.now()) return el.remove();
      const at = [...box.querySelectorAll(":scope > [data-incident]")].indexOf(el);
      rows.splice(Math.min(at, rows.length), 0, el);
    });
    box.querySelectorAll(":scope > :not([data-incident])").forEach((el) => el.remove());
    // in the server's order, moving only what is out of place (a moved row loses focus)
    rows.forEach((row, i) => {
      if (box.children[i] !== row) box.insertBefore(row, box.children[i] || null);
    });
    if (!rows.length) {
      const empty = fresh.querySelector(":scope > :not([data-incident])");
      if (empty) box.append(document.importNode(empty, true));
    }
    if (focus) focus.focus();
  }

  // one read at a time; changes announced during a read bring one more read after it
  let incidentsBusy = false, incidentsAgain = false;
  async function refreshIncidents() {
    const box = document.getElementById("incidents");
    if (!box) return;
    if (incidentsBusy) { incidentsAgain = true; return; }
    incidentsBusy = true;
    const note = document.getElementById("incidents-note");
    try {
      const resp = await fetch(box.dataset.src, { credentials: "same-origin", headers: { Accept: "text/html" } });
      if (resp.status === 401) {
        if (note) { note.replaceChildren(T.list_signed_out, " ", signInLink()); note.hidden = false; }
        return;
      }
      if (!resp.ok) return;  // the next round tries again
      // parsed, never run: the server escaped every value, and the page's CSP runs no inline script
      const doc = new DOMParser().parseFromString(await resp.text(), "text/html");
      const fragment = doc.getElementById("incidents-fragment");
      const fresh = doc.getElementById("incidents");
      if (!fragment || !fresh) return;
      setSkew(fragment.dataset.now);
      mergeIncidents(box, fresh);
      const summary = doc.getElementById("incidents-summary");
      if (summary) document.getElementById("incidents-summary")?.replaceWith(document.importNode(summary, true));
      if (note) note.hidden = true;
      refreshSince();
    } catch (err) {
      console.error("incidents", err);
    } finally {
      incidentsBusy = false;
      if (incidentsAgain) { incidentsAgain = false; refreshIncidents(); }
    }
  }

  // a function that (re)starts reading with `read` every `seconds` while the page is visible: a
  // full period after each read, and after each call
  function whileVisible(seconds, read) {
    let timer = null;
    const again = () => {
      clearTimeout(timer);
      timer = setTimeout(async () => {
        if (document.visibilityState === "visible") await read();
        again();
      }, seconds * 1000);
    };
    return again;
  }

  const scheduleIncidents = whileVisible(CFG.incidentsRefreshS || 5, refreshIncidents);

  function setupIncidents() {
    if (!document.getElementById("incidents")) return;
    setSkew(document.getElementById("incidents-fragment")?.dataset.now);
    refreshSince();
    document.addEventListener("submit", (ev) => { onIncidentSubmit(ev).catch(console.error); });
    document.addEventListener("visibilitychange", () => {
      if (document.visibilityState === "visible") refreshIncidents();
    });
    scheduleIncidents();
  }

  // -- jobs: Enable and Disable (admins) -------------------------------------------------------
  // A button calls the JSON API with the page's sign-in (its cookie), as the incidents' buttons
  // do, naming the version the page shows (If-Match): a job changed meanwhile is refused (412),
  // not changed blindly. Done, the page is read again: the server renders the new state.

  function reloadLink() {
    return h("a", { href: location.pathname + location.search }, T.reload);
  }

  async function onJobButton(ev) {
    const button = ev.target.closest && ev.target.closest("button[data-job-action]");
    const holder = button && button.closest("[data-job]");
    if (!holder) return;
    const out = holder.querySelector(".outcome");
    const tell = (kind, ...parts) => {
      if (!out) return;
      out.dataset.kind = kind;
      out.replaceChildren(...parts);
    };
    button.disabled = true;
    tell("busy", T.saving);
    let resp = null, body = null;
    try {
      resp = await fetch("/api/jobs/" + encodeURIComponent(holder.dataset.job) + "/" + button.dataset.jobAction, {
        method: "POST",
        credentials: "same-origin",
        headers: { Accept: "application/json", "If-Match": '"' + holder.dataset.version + '"' },
      });
      body = await resp.json().catch(() => null);
    } catch (err) {
      resp = null;
    } finally {
      button.disabled = false;
    }
    if (resp === null) return tell("error", T.err_network);
    if (resp.status === 401) return tell("error", T.err_signed_out, " ", signInLink());
    if (resp.status === 412) return tell("error", T.job_changed, " ", reloadLink());
    if (!resp.ok) {
      const why = body && body.message ? " " + body.message : "";
      return tell("error", T.job_refused.replace("{status}", resp.status) + why);
    }
    location.reload();
  }

  // -- a job's flow chart ----------------------------------------------------------------------
  // The steps and edges come from the server (aegis_orchestration.graph, in CFG.jobGraph): placed
  // where the job's designer put them when it placed every step, else laid out by dagre
  // (vendored) top to bottom, each SEQUENCE, PARALLEL and CHOICE boxed with what it holds. Drawn
  // as SVG: every step is a link to its line in the outline, named for screen readers with what
  // it is, where it leads and its state in the execution shown. The execution shown is the
  // newest unless one is chosen ("Show on the chart"); the list is read again every few seconds
  // while the page is visible (an unchanged list is answered 304 by its ETag), so a running
  // execution's steps change colour without a reload.

  const SVGNS = "http://www.w3.org/2000/svg";
  const NODE_H = 62, PAD_X = 14, NODE_MIN_W = 128, NODE_MAX_W = 250, LABEL_MAX = 28;
  // a narrow screen (a phone) gets a tighter chart: shorter words in the boxes and on the edges
  const NARROW = window.matchMedia("(max-width: 640px)");
  const narrow = () => NARROW.matches;
  const pad = () => (narrow() ? 9 : PAD_X);
  const TERMINAL = { w: 64, h: 28, side: 0 };
  const RETRY_W = 30;
  const ID_FONT = "700 13px ui-monospace, SFMono-Regular, Menlo, Consolas, monospace";
  const SMALL_FONT = "600 11px system-ui, -apple-system, 'Segoe UI', Roboto, 'Noto Sans KR', sans-serif";
  const KIND_GLYPH = { PARALLEL: "⇉", CHOICE: "◇", SEQUENCE: "☰", WAIT: "◷", DUMMY: "○" };

  function sv(tag, attrs, ...children) {
    const el = document.createElementNS(SVGNS, tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") el.setAttribute("class", v);
      else if (k === "dataset") Object.assign(el.dataset, v);
      else el.setAttribute(k, String(v));
    }
    for (const c of children.flat()) {
      if (c === null || c === undefined || c === false) continue;
      el.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return el;
  }

  let measurer = null;
  function textWidth(text, font) {
    measurer = measurer || document.createElement("canvas").getContext("2d");
    measurer.font = font;
    return measurer.measureText(text).width;
  }

  function clip(text, max) {
    return text.length > max ? text.slice(0, max - 1) + "…" : text;
  }

  // what a step is: "TASK · SLACK_NOTIFY", "FLOW · WAIT · 120 s", "DUMMY"
  function kindWords(n) {
    return [n.type, n.sub, n.sub === "WAIT" && n.wait_s !== null ? num(n.wait_s) + " s" : null].filter(Boolean).join(" · ");
  }

  // the same in its box: a FLOW by its sign and sub type ("⇉ PARALLEL", "◷ WAIT · 120 s"); on a
  // narrow screen a TASK by its sub type alone
  function kindText(n) {
    if (n.type === "TASK" && narrow()) return n.sub;
    if (n.type !== "FLOW") return (KIND_GLYPH[n.type] ? KIND_GLYPH[n.type] + " " : "") + kindWords(n);
    return KIND_GLYPH[n.sub] + " " + kindWords(n).replace(/^FLOW · /, "");
  }

  function stateText(state) {
    return ((CFG.runGlyphs || {})[state] || "?") + " " + (T["run_" + state] || state);
  }

  function edgeLabel(e) {
    if (e.kind === "if") return T.step_if + " " + clip(e.label || "", narrow() ? 10 : LABEL_MAX);
    if (e.kind === "default") return T.step_default;
    if (e.kind === "no_branch") return T.edge_no_branch;
    if (e.kind === "catch") return T.step_catch;
    return "";
  }

  function nodeName(G, id) {
    return id === G.start ? T.graph_start : id === G.end ? T.graph_end : id;
  }

  // what a step is and where it leads, in words (its aria-label and its tooltip)
  function describe(G, n, state) {
    const parts = [n.id + (n.name ? " (" + n.name + ")" : "") + ": " + kindWords(n)];
    if (n.start) parts.push(T.step_start);
    for (const e of G.edges.filter((x) => x.from === n.id)) {
      const to = nodeName(G, e.to);
      if (e.kind === "retry") parts.push(T.step_retry.replace("{n}", e.label));
      else if (e.kind === "catch") parts.push(T.step_catch + " → " + to);
      else if (e.kind === "branch") parts.push(T.edge_branch.replace("{step}", to));
      else if (e.kind === "if") parts.push(T.step_if + " " + e.label + " → " + to);
      else if (e.kind === "default") parts.push(T.step_default + " → " + to);
      else if (e.kind === "no_branch") parts.push(T.edge_no_branch + " → " + to);
      else if (e.back) parts.push(T.step_loop + " " + to);
      else parts.push(T.edge_then.replace("{step}", to));
    }
    if (state) parts.push(T.step_state.replace("{state}", T["run_" + state] || state));
    return parts.join("; ");
  }

  function nodeWidth(n) {
    const states = ["PENDING", "SUCCEEDED", "REPEAT_LIMIT", "SKIPPED"].map((s) => textWidth(stateText(s), SMALL_FONT));
    const w = Math.max(textWidth(clip(n.id, 30), ID_FONT), textWidth(kindText(n), SMALL_FONT), ...states) + 2 * pad();
    return Math.round(Math.min(NODE_MAX_W, Math.max(narrow() ? 96 : NODE_MIN_W, w)));
  }

  // where everything goes: {nodes: id -> {x, y, w, h} (centres), clusters: id -> box, edges: [{e, points, label}]}
  function layoutGraph(G) {
    const size = {};
    // a TASK that retries has its loop drawn beside it: room is kept for it on its right
    const retried = new Set(G.edges.filter((e) => e.kind === "retry").map((e) => e.from));
    for (const n of G.nodes) size[n.id] = { w: nodeWidth(n), h: NODE_H, side: retried.has(n.id) ? RETRY_W : 0 };
    size[G.start] = TERMINAL;
    size[G.end] = TERMINAL;
    const drawn = G.edges.filter((e) => e.kind !== "retry");
    const used = new Set(drawn.flatMap((e) => [e.from, e.to]));
    return G.placed ? placedLayout(G, size, drawn, used) : autoLayout(G, size, drawn, used);
  }

  function autoLayout(G, size, drawn, used) {
    const g = new dagre.graphlib.Graph({ compound: true, multigraph: true });
    const tight = narrow();
    g.setGraph({ rankdir: "TB", nodesep: tight ? 12 : 26, ranksep: tight ? 34 : 40, edgesep: tight ? 6 : 12, marginx: tight ? 4 : 12, marginy: 12 });
    g.setDefaultEdgeLabel(() => ({}));
    for (const id of [G.start, G.end]) if (used.has(id)) g.setNode(id, { width: size[id].w, height: size[id].h });
    for (const n of G.nodes) {
      g.setNode(n.id, { width: size[n.id].w + size[n.id].side, height: size[n.id].h });
      if (n.container) g.setNode("box:" + n.id, {});
    }
    for (const n of G.nodes) {
      if (n.container) {
        g.setParent(n.id, "box:" + n.id);
        if (n.parent) g.setParent("box:" + n.id, "box:" + n.parent);
      } else if (n.parent) g.setParent(n.id, "box:" + n.parent);
    }
    drawn.forEach((e, i) => {
      const text = edgeLabel(e);
      const label = text ? { width: textWidth(text, SMALL_FONT) + 10, height: 16, labelpos: "c" } : {};
      // a loop is laid out forwards (the run order ranks the steps), drawn backwards
      if (e.back) g.setEdge(e.to, e.from, { ...label, minlen: 1, weight: 0 }, "e" + i);
      else g.setEdge(e.from, e.to, { ...label, minlen: 1, weight: e.kind === "catch" ? 1 : 2 }, "e" + i);
    });
    dagre.layout(g);
    const nodes = {}, clusters = {};
    for (const id of g.nodes()) {
      const v = g.node(id);
      if (id.startsWith("box:")) clusters[id.slice(4)] = { x: v.x - v.width / 2, y: v.y - v.height / 2, w: v.width, h: v.height };
      else {
        const side = (size[id] || TERMINAL).side;
        nodes[id] = { x: v.x - side / 2, y: v.y, w: v.width - side, h: v.height };
      }
    }
    const edges = drawn.map((e, i) => {
      const v = e.back ? g.edge(e.to, e.from, "e" + i) : g.edge(e.from, e.to, "e" + i);
      const points = v.points.slice();
      if (e.back) points.reverse();
      return { e, points, label: edgeLabel(e) ? { x: v.x, y: v.y } : null };
    });
    const box = g.graph();
    return { nodes, clusters, edges, width: box.width, height: box.height };
  }

  // the designer's places (top left corners), moved so the chart starts at the margin
  function placedLayout(G, size, drawn, used) {
    const M = 16, nodes = {};
    const at = Object.fromEntries(G.nodes.map((n) => [n.id, n.at]));
    const minX = Math.min(...G.nodes.map((n) => n.at[0])), minY = Math.min(...G.nodes.map((n) => n.at[1]));
    const top = used.has(G.start) ? TERMINAL.h + 40 : 0;
    for (const n of G.nodes) {
      const s = size[n.id];
      nodes[n.id] = { x: at[n.id][0] - minX + M + s.w / 2, y: at[n.id][1] - minY + M + top + s.h / 2, w: s.w, h: s.h };
    }
    const first = nodes[G.edges.find((e) => e.from === G.start).to];
    nodes[G.start] = { x: first.x, y: first.y - first.h / 2 - 40 - TERMINAL.h / 2, w: TERMINAL.w, h: TERMINAL.h };
    const bottom = Math.max(...Object.values(nodes).map((b) => b.y + b.h / 2));
    const right = Math.max(...Object.values(nodes).map((b) => b.x + b.w / 2));
    if (used.has(G.end)) nodes[G.end] = { x: (M + right) / 2, y: bottom + 40 + TERMINAL.h / 2, w: TERMINAL.w, h: TERMINAL.h };
    const clusters = {};
    const inner = (id) => G.nodes.filter((n) => n.parent === id).flatMap((n) => [n.id, ...(n.container ? inner(n.id) : [])]);
    for (const n of [...G.nodes].reverse()) {
      if (!n.container) continue;
      const ids = [n.id, ...inner(n.id)];
      const boxes = ids.map((id) => clusters[id] ? clusters[id] : { x: nodes[id].x - nodes[id].w / 2, y: nodes[id].y - nodes[id].h / 2, w: nodes[id].w, h: nodes[id].h });
      const x0 = Math.min(...boxes.map((b) => b.x)) - 10, y0 = Math.min(...boxes.map((b) => b.y)) - 10;
      const x1 = Math.max(...boxes.map((b) => b.x + b.w)) + 10, y1 = Math.max(...boxes.map((b) => b.y + b.h)) + 10;
      clusters[n.id] = { x: x0, y: y0, w: x1 - x0, h: y1 - y0 };
    }
    const edges = drawn.map((e) => {
      const a = nodes[e.from], b = nodes[e.to];
      const ends = [border(a, b), border(b, a)];
      const mid = { x: (ends[0].x + ends[1].x) / 2, y: (ends[0].y + ends[1].y) / 2 };
      if (!e.back) return { e, points: ends, label: edgeLabel(e) ? mid : null };
      // a loop bows away from the straight line its way forward would take
      const dx = ends[1].x - ends[0].x, dy = ends[1].y - ends[0].y, len = Math.hypot(dx, dy) || 1;
      const bow = 30 + 0.15 * len;
      const top = { x: mid.x + (dy / len) * bow, y: mid.y - (dx / len) * bow };
      return { e, points: [ends[0], top, ends[1]], label: edgeLabel(e) ? top : null };
    });
    const all = [...Object.values(nodes).map((b) => ({ x: b.x + b.w / 2, y: b.y + b.h / 2 })),
      ...Object.values(clusters).map((c) => ({ x: c.x + c.w, y: c.y + c.h }))];
    return { nodes, clusters, edges, width: Math.max(...all.map((p) => p.x)) + M + RETRY_W, height: Math.max(...all.map((p) => p.y)) + M };
  }

  // where the line from the centre of a to the centre of b leaves a's box
  function border(a, b) {
    const dx = b.x - a.x, dy = b.y - a.y;
    if (!dx && !dy) return { x: a.x, y: a.y };
    const t = Math.min(Math.abs(dx) > 0 ? (a.w / 2) / Math.abs(dx) : Infinity, Math.abs(dy) > 0 ? (a.h / 2) / Math.abs(dy) : Infinity);
    return { x: a.x + dx * t, y: a.y + dy * t };
  }

  // a smooth line through the points (a B-spline, as d3's curveBasis draws one)
  function pathOf(pts) {
    if (pts.length < 3) return "M" + pts.map((p) => p.x.toFixed(1) + "," + p.y.toFixed(1)).join("L");
    const f = (v) => v.toFixed(1);
    let d = "M" + f(pts[0].x) + "," + f(pts[0].y);
    d += "L" + f((5 * pts[0].x + pts[1].x) / 6) + "," + f((5 * pts[0].y + pts[1].y) / 6);
    for (let i = 2; i <= pts.length; i++) {
      const p0 = pts[i - 2], p1 = pts[i - 1], p = pts[Math.min(i, pts.length - 1)];
      d += "C" + f((2 * p0.x + p1.x) / 3) + "," + f((2 * p0.y + p1.y) / 3) + " " + f((p0.x + 2 * p1.x) / 3) + "," +
        f((p0.y + 2 * p1.y) / 3) + " " + f((p0.x + 4 * p1.x + p.x) / 6) + "," + f((p0.y + 4 * p1.y + p.y) / 6);
    }
    const last = pts[pts.length - 1];
    return d + "L" + f(last.x) + "," + f(last.y);
  }

  function edgeClass(e) {
    return "gedge ge-" + e.kind + (e.back ? " ge-back" : "");
  }

  function drawJobGraph() {
    const holder = document.getElementById("job-graph");
    const G = CFG.jobGraph;
    if (!holder || !G) return;
    if (!G.placed && typeof dagre === "undefined") {
      holder.replaceChildren(h("p", { class: "muted" }, T.graph_needs_script));
      return;
    }
    const L = layoutGraph(G);
    const markers = ["next", "catch", "back", "retry"].map((k) => sv("marker", { id: "arrow-" + k, viewBox: "0 0 10 10", refX: 9, refY: 5,
      markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse", class: "arrow arrow-" + k }, sv("path", { d: "M0,0L10,5L0,10z" })));
    const title = T.graph_label.replace("{job}", holder.dataset.job);
    const svg = sv("svg", { xmlns: SVGNS, viewBox: "0 0 " + Math.ceil(L.width) + " " + Math.ceil(L.height), width: Math.ceil(L.width),
      height: Math.ceil(L.height), role: "group", "aria-label": title, class: "flow" }, sv("defs", {}, markers));
    // the boxes, outermost first
    const boxes = sv("g", { class: "gclusters", "aria-hidden": "true" });
    for (const n of G.nodes) {
      const c = L.clusters[n.id];
      if (c) boxes.append(sv("rect", { class: "gcluster gc-" + String(n.sub).toLowerCase(), x: c.x, y: c.y, width: c.w, height: c.h, rx: 12, dataset: { cluster: n.id } }));
    }
    const lines = sv("g", { class: "gedges", "aria-hidden": "true" });
    const labels = sv("g", { class: "glabels", "aria-hidden": "true" });
    for (const { e, points, label } of L.edges) {
      const arrow = e.kind === "catch" ? "catch" : e.back ? "back" : "next";
      lines.append(sv("path", { class: edgeClass(e), d: pathOf(points), "marker-end": "url(#arrow-" + arrow + ")",
        dataset: { from: e.from, to: e.to, kind: e.kind } }));
      if (label) {
        const text = edgeLabel(e);
        const w = textWidth(text, SMALL_FONT) + 10;
        labels.append(sv("g", { class: "glabel gl-" + e.kind, transform: "translate(" + label.x.toFixed(1) + "," + label.y.toFixed(1) + ")" },
          e.label ? sv("title", {}, e.label) : null,
          sv("rect", { x: -w / 2, y: -9, width: w, height: 18, rx: 4 }),
          sv("text", { "text-anchor": "middle", y: 4 }, text)));
      }
    }
    const nodes = sv("g", { class: "gnodes" });
    for (const id of [G.start, G.end]) {
      const b = L.nodes[id];
      if (!b) continue;
      nodes.append(sv("g", { class: "gterm", transform: "translate(" + b.x + "," + b.y + ")", "aria-hidden": "true", dataset: { terminal: id === G.start ? "start" : "end" } },
        sv("rect", { x: -b.w / 2, y: -b.h / 2, width: b.w, height: b.h, rx: b.h / 2 }),
        sv("text", { "text-anchor": "middle", y: 4 }, nodeName(G, id))));
    }
    for (const n of G.nodes) {
      const b = L.nodes[n.id];
      const retry = G.edges.find((e) => e.from === n.id && e.kind === "retry");
      const link = sv("a", { href: "#step-" + n.id, class: "gnode gk-" + String(n.sub || n.type).toLowerCase() + (n.container ? " gn-container" : ""),
        transform: "translate(" + b.x.toFixed(1) + "," + b.y.toFixed(1) + ")", "aria-label": describe(G, n, null),
        dataset: { node: n.id, kind: n.sub || n.type } },
        sv("title", {}, describe(G, n, null)),
        sv("rect", { class: "gbox", x: -b.w / 2, y: -b.h / 2, width: b.w, height: b.h, rx: n.sub === "CHOICE" ? 18 : 8 }),
        sv("text", { class: "gid", x: -b.w / 2 + pad(), y: -b.h / 2 + 19 }, clip(n.id, 30)),
        sv("text", { class: "gkind", x: -b.w / 2 + pad(), y: -b.h / 2 + 35 }, kindText(n)),
        sv("text", { class: "gstate", x: -b.w / 2 + pad(), y: -b.h / 2 + 52 }, ""),
        retry ? sv("g", { class: "gretry", transform: "translate(" + (b.w / 2) + "," + (-b.h / 2 + 18) + ")" },
          sv("path", { d: "M0,9 C20,9 20,-9 3,-9", class: "gedge ge-retry", "marker-end": "url(#arrow-retry)" }),
          sv("text", { x: 19, y: 4 }, "×" + retry.label)) : null);
      nodes.append(link);
    }
    svg.append(boxes, lines, labels, nodes);
    holder.replaceChildren(svg);
    // the chart keeps its size while the screen has room, and narrows to 60% of it before the
    // panel scrolls sideways
    svg.style.width = "100%";
    svg.style.maxWidth = Math.ceil(L.width) + "px";
    svg.style.minWidth = Math.ceil(L.width * 0.6) + "px";
    svg.style.height = "auto";
    holder.dataset.drawn = String(G.nodes.length);
  }

  // -- the execution the chart shows, and the list read again ---------------------------------

  let pickedRun = null;  // an execution chosen on the page; none: the newest that ran

  function runRows() {
    return [...document.querySelectorAll("#executions tr[data-execution]")];
  }

  function parsed(text) {
    try { return JSON.parse(text || "{}"); } catch (err) { return {}; }
  }

  function showRun() {
    const G = CFG.jobGraph;
    const holder = document.getElementById("job-graph");
    if (!G || !holder) return;
    const rows = runRows();
    // unpicked: the newest that ran (one skipped because another was running ran no step)
    const ran = rows.find((r) => !/^SKIPPED/.test(r.dataset.status || ""));
    const row = (pickedRun && rows.find((r) => r.dataset.execution === pickedRun)) || ran || rows[0] || null;
    for (const r of rows) {
      r.classList.toggle("exec-shown", r === row);
      r.querySelector(".exec-pick")?.setAttribute("aria-pressed", String(r === row));
    }
    const states = row ? parsed(row.dataset.states) : {};
    const errors = row ? parsed(row.dataset.stepErrors) : {};
    holder.dataset.execution = row ? row.dataset.execution : "";
    holder.dataset.status = row ? row.dataset.status : "";
    for (const n of G.nodes) {
      const el = holder.querySelector('.gnode[data-node="' + CSS.escape(n.id) + '"]');
      if (!el) continue;
      const state = states[n.id] || null;
      el.dataset.state = state || "";
      el.setAttribute("class", el.getAttribute("class").replace(/\s*gs-\w+/g, "") + (state ? " gs-" + state.toLowerCase() : ""));
      el.querySelector(".gstate").textContent = state ? stateText(state) : "";
      let words = describe(G, n, state);
      if (errors[n.id]) words += "; " + T.error + ": " + errors[n.id];
      el.setAttribute("aria-label", words);
      el.querySelector("title").textContent = words;
    }
    const said = document.getElementById("graph-run");
    if (said) {
      if (!row) said.replaceChildren(T.graph_no_run);
      else {
        const status = row.dataset.status;
        const parts = [T.graph_showing.replace("{id}", row.dataset.execution), " ",
          h("span", { class: "run-status rs-" + status.toLowerCase() }, stateText(status))];
        const version = document.getElementById("job-executions")?.dataset.jobVersion;
        if (row.dataset.jobVersion && version && row.dataset.jobVersion !== version) {
          parts.push(" ", h("span", { class: "muted" }, T.graph_other_version.replace("{v}", row.dataset.jobVersion).replace("{w}", version)));
        }
        said.replaceChildren(...parts);
      }
    }
    const list = document.getElementById("graph-errors");
    if (list) {
      const failed = Object.entries(errors);
      const whole = row?.querySelector(".exec-error")?.textContent;
      const lines = failed.map(([id, text]) => h("span", { class: "run-error", dataset: { stepError: id } }, h("code", {}, id), " ", text));
      if (whole && !failed.some(([, text]) => text === whole)) lines.push(h("span", { class: "run-error" }, whole));
      list.replaceChildren(...lines);
      list.hidden = !failed.length && !whole;
    }
  }

  let runsTag = null, runsBusy = false;
  async function refreshRuns() {
    const box = document.getElementById("job-executions");
    if (!box || runsBusy) return;
    runsBusy = true;
    try {
      const headers = { Accept: "text/html" };
      if (runsTag) headers["If-None-Match"] = runsTag;
      const resp = await fetch(box.dataset.src, { credentials: "same-origin", headers });
      if (resp.status === 304 || !resp.ok) {
        if (resp.status === 401) document.getElementById("graph-run")?.replaceChildren(T.list_signed_out, " ", signInLink());
        return;
      }
      runsTag = resp.headers.get("ETag");
      // parsed, never run: the server escaped every value, and the page's CSP runs no inline script
      const doc = new DOMParser().parseFromString(await resp.text(), "text/html");
      const fresh = doc.getElementById("job-executions");
      if (!fresh) return;
      const focused = document.activeElement?.dataset?.pick;
      box.replaceWith(document.importNode(fresh, true));
      if (focused) document.querySelector('.exec-pick[data-pick="' + CSS.escape(focused) + '"]')?.focus();
      showRun();
    } catch (err) {
      console.error("executions", err);
    } finally {
      runsBusy = false;
    }
  }


  function setupJobGraph() {
    if (!CFG.jobGraph) return;
    const draw = () => {
      try { drawJobGraph(); } catch (err) { console.error("job graph", err); }
      showRun();
    };
    draw();
    NARROW.addEventListener("change", draw);  // a phone turned, a window narrowed
    document.addEventListener("click", (ev) => {
      const pick = ev.target.closest && ev.target.closest("button[data-pick]");
      if (!pick) return;
      pickedRun = pick.dataset.pick;
      showRun();
    });
    document.addEventListener("visibilitychange", () => {
      if (document.visibilityState === "visible") refreshRuns();
    });
    whileVisible(CFG.executionsRefreshS || 3, refreshRuns)();
  }

  // -- the live stream ----------------------------------------------------------------------

  const live = document.getElementById("live");
  function liveState(state) {
    if (!live) return;
    live.dataset.state = state;
    live.querySelector(".live-text").textContent = state === "open" ? T.live : T.reconnecting;
  }

  let source = null, backoff = 1000;
  function connect() {
    source = new EventSource("/api/live");
    source.onopen = () => { backoff = 1000; liveState("open"); };
    source.onerror = () => {
      liveState("connecting");
      if (source.readyState === EventSource.CLOSED) {
        // the server answered something other than a stream (401, a proxy's 502): the browser
        // does not retry by itself then; check the sign-in and try again with a backoff
        source.close();
        fetch("/api/fleet", { credentials: "same-origin" }).then((r) => { if (r.status === 401) toLogin(); }).catch(() => {});
        setTimeout(connect, backoff);
        backoff = Math.min(backoff * 2, 30000);
      }
    };
    const on = (name, fn) => source.addEventListener(name, (ev) => {
      try { fn(JSON.parse(ev.data)); } catch (err) { console.error(name, err); }
    });
    on("fleet", onFleet);
    on("factory", onFactory);
    on("factory_removed", (d) => document.querySelector('#fleet [data-factory="' + CSS.escape(d.factory_id) + '"]')?.remove());
    on("alerts", onAlerts);
    on("incident", () => { refreshIncidents(); });  // opened, acknowledged, escalated, resolved
    on("cloud", onCloud);
    on("graph", (d) => {
      if (page === "factory" && d.target === CFG.factoryId && currentWindow() !== "1h") {
        setTimeout(() => loadHistory(currentWindow()).catch(console.error), Math.random() * 5000);
      }
    });
    on("reports", () => {
      const list = document.getElementById("report-targets");
      if (list && !list.querySelector(".new")) list.append(h("li", { class: "new" }, h("a", { href: location.pathname + location.search }, "↻")));
    });
    on("resync", () => {
      refreshIncidents();  // changes were missed while the stream was away
      if (page === "factory") loadHistory(currentWindow()).catch(console.error);
      if (page === "cloud") loadCloud().catch(console.error);
    });
  }

  document.addEventListener("DOMContentLoaded", () => {
    setSkew(document.getElementById("incidents-fragment")?.dataset.now);
    tick();
    setInterval(tick, 1000);
    if (page === "login") return;
    if (page === "factory") setupFactory();
    if (page === "cloud") loadCloud().catch(console.error);
    if (page === "jobs" || page === "job") {
      document.addEventListener("click", (ev) => { onJobButton(ev).catch(console.error); });
    }
    if (page === "job") setupJobGraph();
    setupIncidents();
    connect();
  });
})();
