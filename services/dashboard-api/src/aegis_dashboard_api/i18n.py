"""The page's labels in Korean and English, and which language a request gets: ``?lang=`` (kept
in a cookie), else the cookie, else the browser's Accept-Language, else English."""

from __future__ import annotations

from typing import Literal

Lang = Literal["ko", "en"]
LANGS: tuple[Lang, ...] = ("ko", "en")
LANG_COOKIE = "aegis_lang"

LABELS: dict[str, dict[Lang, str]] = {
    "title": {"en": "AEGIS operations", "ko": "AEGIS 운영 현황"},
    "fleet": {"en": "Fleet", "ko": "공장 현황"},
    "cloud": {"en": "Cloud infra", "ko": "클라우드 인프라"},
    "reports": {"en": "Reports", "ko": "보고서"},
    "alerts": {"en": "Open alerts", "ko": "발생 중인 경보"},
    "no_alerts": {"en": "No open alerts", "ko": "발생 중인 경보 없음"},
    "no_factories": {
        "en": "No factory has reported yet",
        "ko": "아직 데이터를 보낸 공장이 없습니다",
    },
    "NORMAL": {"en": "Normal", "ko": "정상"},
    "WARNING": {"en": "Warning", "ko": "주의"},
    "CRITICAL": {"en": "Critical", "ko": "위험"},
    "UNKNOWN": {"en": "Unknown", "ko": "알 수 없음"},
    "stale": {"en": "Stale", "ko": "지연"},
    "offline": {"en": "Offline", "ko": "오프라인"},
    "score": {"en": "Risk score", "ko": "위험 점수"},
    "reasons": {"en": "Reasons", "ko": "원인"},
    "no_reasons": {"en": "No active reasons", "ko": "감지된 원인 없음"},
    "last_data": {"en": "Last data", "ko": "최근 데이터"},
    "ago": {"en": "ago", "ko": "전"},
    "pipeline": {"en": "Pipeline", "ko": "파이프라인"},
    "updated": {"en": "Updated", "ko": "갱신"},
    "window": {"en": "Window", "ko": "기간"},
    "sensors": {"en": "Sensors", "ko": "센서"},
    "risk": {"en": "Risk score", "ko": "위험 점수"},
    "ai": {"en": "AI detections (confidence)", "ko": "AI 탐지 (신뢰도)"},
    "infra": {"en": "Edge infrastructure", "ko": "엣지 인프라"},
    "camera": {"en": "Latest camera image", "ko": "최근 카메라 이미지"},
    "no_image": {"en": "No image yet", "ko": "이미지 없음"},
    "no_data": {"en": "No data in this window", "ko": "이 기간의 데이터가 없습니다"},
    "factory_alerts": {"en": "Open alerts of this factory", "ko": "이 공장의 경보"},
    "overall": {"en": "Overall", "ko": "종합"},
    "fast": {"en": "Fast checks (1 min)", "ko": "빠른 점검 (1분)"},
    "slow": {"en": "Slow checks (5 min)", "ko": "느린 점검 (5분)"},
    "check": {"en": "Check", "ko": "점검 항목"},
    "status": {"en": "Status", "ko": "상태"},
    "value": {"en": "Value", "ko": "측정값"},
    "history": {"en": "History", "ko": "이력"},
    "no_cloud": {"en": "No collector run yet", "ko": "아직 수집된 점검 결과가 없습니다"},
    "date": {"en": "Report date (KST)", "ko": "보고서 날짜 (KST)"},
    "show": {"en": "Show", "ko": "보기"},
    "no_reports": {"en": "No report for this date", "ko": "이 날짜의 보고서가 없습니다"},
    "choose_report": {"en": "Choose a report", "ko": "보고서를 선택하세요"},
    "live": {"en": "Live", "ko": "실시간"},
    "reconnecting": {"en": "Reconnecting…", "ko": "재연결 중…"},
    "sign_in": {"en": "Sign in", "ko": "로그인"},
    "sign_out": {"en": "Sign out", "ko": "로그아웃"},
    "token": {"en": "Access token", "ko": "접근 토큰"},
    "token_help": {
        "en": "A read-only dashboard token from your administrator.",
        "ko": "관리자에게 받은 읽기 전용 대시보드 토큰입니다.",
    },
    "bad_token": {"en": "That token is not valid.", "ko": "유효하지 않은 토큰입니다."},
    "need_token": {"en": "Sign in to see the dashboard.", "ko": "대시보드를 보려면 로그인하세요."},
    "unknown_factory": {"en": "Unknown factory", "ko": "알 수 없는 공장"},
    "back": {"en": "Back to the fleet", "ko": "공장 현황으로"},
    "language": {"en": "Language", "ko": "언어"},
    "severity": {"en": "Severity", "ko": "등급"},
    "scope": {"en": "Where", "ko": "대상"},
    "reason": {"en": "Reason", "ko": "원인"},
    "since": {"en": "Since", "ko": "시작"},
    "factories_n": {"en": "factories", "ko": "개 공장"},
    "times_kst": {"en": "Times in KST (hover: UTC)", "ko": "시간은 KST (마우스를 올리면 UTC)"},
    # incidents: the page, the factory's banners, the buttons and what they answer
    "incidents": {"en": "Incidents", "ko": "사고 대응"},
    "open_incidents": {"en": "Open incidents", "ko": "진행 중인 사고"},
    "no_incidents": {"en": "No open incidents", "ko": "진행 중인 사고 없음"},
    "incidents_order": {
        "en": "Critical first, then the oldest",
        "ko": "위험 등급 우선, 그다음 오래된 순",
    },
    "incident_banner": {"en": "Open incident", "ko": "진행 중인 사고"},
    "all_incidents": {"en": "All incidents", "ko": "전체 사고 목록"},
    "state": {"en": "State", "ko": "상태"},
    "state_triggered": {"en": "Triggered", "ko": "발생"},
    "state_acknowledged": {"en": "Acknowledged", "ko": "확인됨"},
    "state_resolved": {"en": "Resolved", "ko": "종료됨"},
    "level": {"en": "Escalation level", "ko": "에스컬레이션 단계"},
    "level_short": {"en": "level", "ko": "단계"},
    "open_for": {"en": "Open for", "ko": "경과 시간"},
    "triggered_at": {"en": "Triggered", "ko": "발생 시각"},
    "acknowledged": {"en": "Acknowledged", "ko": "확인"},
    "not_acknowledged": {"en": "Nobody yet", "ko": "아직 확인한 사람 없음"},
    "by": {"en": "by", "ko": "확인자"},
    "via": {"en": "via", "ko": "경로"},
    "acknowledge": {"en": "Acknowledge", "ko": "확인"},
    "resolve": {"en": "Resolve", "ko": "종료"},
    "ack_note": {"en": "Note (optional)", "ko": "메모 (선택)"},
    "resolve_note": {"en": "Why it is closed (required)", "ko": "종료 사유 (필수)"},
    "timeline": {"en": "Timeline", "ko": "타임라인"},
    "tl_time": {"en": "Time", "ko": "시각"},
    "tl_what": {"en": "What", "ko": "내용"},
    "tl_who": {"en": "Who", "ko": "주체"},
    "tl_via": {"en": "Via", "ko": "경로"},
    "tl_receiver": {"en": "Receiver", "ko": "수신처"},
    "tl_outcome": {"en": "Outcome", "ko": "결과"},
    "kind_triggered": {"en": "Triggered", "ko": "발생"},
    "kind_severity_raised": {"en": "Severity raised", "ko": "등급 상승"},
    "kind_notified": {"en": "Notified", "ko": "알림 발송"},
    "kind_escalated": {"en": "Escalated", "ko": "에스컬레이션"},
    "kind_acknowledged": {"en": "Acknowledged", "ko": "확인"},
    "kind_resolved": {"en": "Resolved", "ko": "종료"},
    "kind_silenced": {"en": "Silenced", "ko": "알림 중지"},
    "kind_unsilenced": {"en": "Silence ended", "ko": "알림 재개"},
    "kind_archived": {"en": "Archived", "ko": "보관"},
    "kind_note": {"en": "Note", "ko": "메모"},
    "saving": {"en": "Saving…", "ko": "저장 중…"},
    "done_ack": {"en": "Acknowledged by {who}", "ko": "{who} 님이 확인했습니다"},
    "already_ack": {
        "en": "Already acknowledged by {who}",
        "ko": "이미 {who} 님이 확인했습니다",
    },
    "done_resolve": {
        "en": "Resolved by {who}: it leaves the list",
        "ko": "{who} 님이 종료했습니다. 목록에서 사라집니다",
    },
    "note_required": {
        "en": "Write a note saying why before resolving.",
        "ko": "종료하려면 사유를 적어 주세요.",
    },
    "err_resolved": {
        "en": "This incident was resolved already; nothing was changed.",
        "ko": "이미 종료된 사고입니다. 변경된 내용이 없습니다.",
    },
    "err_signed_out": {
        "en": "You are signed out; nothing was changed.",
        "ko": "로그아웃되었습니다. 변경된 내용이 없습니다.",
    },
    "sign_in_again": {"en": "Sign in again", "ko": "다시 로그인"},
    "err_unknown_incident": {
        "en": "This incident is no longer in the list.",
        "ko": "목록에 없는 사고입니다.",
    },
    "err_failed": {
        "en": "Not saved (the server answered {status}); try again.",
        "ko": "저장하지 못했습니다 (서버 응답 {status}). 다시 시도하세요.",
    },
    "err_network": {
        "en": "The dashboard could not be reached; nothing was saved.",
        "ko": "대시보드에 연결할 수 없습니다. 저장되지 않았습니다.",
    },
    "list_signed_out": {
        "en": "Signed out: this list is no longer updated.",
        "ko": "로그아웃되어 목록이 갱신되지 않습니다.",
    },
    # a cloud check's alerting rule
    "al_starting": {"en": "Starting", "ko": "시작 중"},
    "al_pending": {"en": "Pending", "ko": "대기"},
    "al_firing": {"en": "Firing", "ko": "경보 중"},
    "al_clearing": {"en": "Clearing", "ko": "해제 중"},
    "al_failing_since": {"en": "failing since", "ko": "실패 시작"},
    "al_passing_since": {"en": "passing since", "ko": "정상 복귀"},
    "al_reported_after": {"en": "reported after", "ko": "보고까지"},
    "al_cleared_after": {"en": "cleared after", "ko": "해제까지"},
    # sign-in with the company's identity provider (signin.py)
    "oidc_refused": {"en": "No access", "ko": "접근 권한 없음"},
    "oidc_no_group": {
        "en": "You signed in as {name}, but your account is in none of the groups this "
        "dashboard gives a role to. Ask an administrator to add you to one.",
        "ko": "{name}(으)로 로그인했지만, 이 대시보드의 역할이 주어진 그룹에 속해 있지 "
        "않습니다. 관리자에게 그룹 추가를 요청하세요.",
    },
    "oidc_failed": {
        "en": "Sign-in did not complete; start again.",
        "ko": "로그인이 완료되지 않았습니다. 다시 시도하세요.",
    },
    "oidc_unreachable": {
        "en": "The sign-in service cannot be reached; try again in a moment.",
        "ko": "로그인 서비스에 연결할 수 없습니다. 잠시 후 다시 시도하세요.",
    },
    "signed_out": {"en": "You are signed out.", "ko": "로그아웃되었습니다."},
    "oidc_sign_in": {"en": "Sign in with your company account", "ko": "회사 계정으로 로그인"},
    "audit": {"en": "Audit", "ko": "감사 기록"},
    "audit_day": {"en": "Day (UTC)", "ko": "날짜 (UTC)"},
    "audit_count": {
        "en": "{shown} of {total} events, newest first",
        "ko": "{total}건 중 {shown}건, 최신순",
    },
    "audit_action": {"en": "Action", "ko": "작업"},
    "audit_outcome": {"en": "Outcome", "ko": "결과"},
    "audit_target": {"en": "On", "ko": "대상"},
    "audit_from": {"en": "From", "ko": "접속 위치"},
    "audit_detail": {"en": "Detail", "ko": "상세"},
    "audit_none": {"en": "Nothing recorded that day.", "ko": "이 날의 기록이 없습니다."},
    "or_token": {"en": "or with a token", "ko": "또는 토큰으로"},
    # orchestration jobs: the list, a job's page, its steps and its executions
    "jobs": {"en": "Jobs", "ko": "자동화 작업"},
    "job_id": {"en": "Id", "ko": "ID"},
    "job_name": {"en": "Name", "ko": "이름"},
    "job_enabled": {"en": "Enabled", "ko": "활성"},
    "job_disabled": {"en": "Disabled", "ko": "비활성"},
    "job_deleted": {"en": "Deleted", "ko": "삭제됨"},
    "job_enable": {"en": "Enable", "ko": "활성화"},
    "job_disable": {"en": "Disable", "ko": "비활성화"},
    "job_actions": {"en": "Actions", "ko": "작업 제어"},
    "trigger_type": {"en": "Trigger type", "ko": "트리거 유형"},
    "trigger": {"en": "Trigger", "ko": "트리거"},
    "condition": {"en": "Condition", "ko": "조건"},
    "steps": {"en": "Steps", "ko": "단계 수"},
    "version": {"en": "Version", "ko": "버전"},
    "created": {"en": "Created", "ko": "생성"},
    "show_deleted": {"en": "Show deleted jobs", "ko": "삭제된 작업 보기"},
    "hide_deleted": {"en": "Hide deleted jobs", "ko": "삭제된 작업 숨기기"},
    "no_jobs": {"en": "No job is registered", "ko": "등록된 작업이 없습니다"},
    "unknown_job": {"en": "Unknown job", "ko": "알 수 없는 작업"},
    "back_jobs": {"en": "Back to the jobs", "ko": "작업 목록으로"},
    "job_steps": {"en": "Steps, in the order they run", "ko": "실행 순서별 단계"},
    "step_start": {"en": "start", "ko": "시작"},
    "step_retry": {"en": "retries up to {n} times", "ko": "최대 {n}회 재시도"},
    "step_wait": {"en": "waits {s} s", "ko": "{s}초 대기"},
    "step_parallel": {"en": "{n} branches at once", "ko": "병렬 분기 {n}개"},
    "step_catch": {"en": "on failure", "ko": "실패 시"},
    "step_next": {"en": "then", "ko": "다음"},
    "step_loop": {"en": "loops back to", "ko": "되돌아감"},
    "step_if": {"en": "if", "ko": "조건"},
    "step_default": {"en": "otherwise", "ko": "그 외"},
    "job_graph": {"en": "Flow", "ko": "흐름도"},
    "graph_label": {
        "en": "The steps of {job} as a flow chart",
        "ko": "{job}의 단계 흐름도",
    },
    "graph_needs_script": {
        "en": "The flow chart needs JavaScript; the steps are listed below.",
        "ko": "흐름도를 보려면 JavaScript가 필요합니다. 단계 목록은 아래에 있습니다.",
    },
    "graph_legend": {"en": "What the colours mean", "ko": "색상 안내"},
    "graph_start": {"en": "Start", "ko": "시작"},
    "graph_end": {"en": "End", "ko": "끝"},
    "graph_showing": {"en": "Showing execution {id}:", "ko": "표시 중인 실행 {id}:"},
    "graph_no_run": {
        "en": "No execution yet: the steps as defined.",
        "ko": "아직 실행 기록이 없습니다. 정의된 단계만 표시합니다.",
    },
    "graph_other_version": {
        "en": "it ran version {v} of the job; the chart is version {w}.",
        "ko": "작업 버전 {v}로 실행되었습니다. 흐름도는 버전 {w}입니다.",
    },
    "show_on_graph": {"en": "Show on the chart", "ko": "흐름도에 표시"},
    "edge_no_branch": {"en": "no branch", "ko": "분기 없음"},
    "edge_then": {"en": "then {step}", "ko": "다음 {step}"},
    "edge_branch": {"en": "branch {step}", "ko": "분기 {step}"},
    "step_state": {"en": "state: {state}", "ko": "상태: {state}"},
    "global_params": {"en": "Global parameters", "ko": "전역 파라미터"},
    "no_params": {"en": "None", "ko": "없음"},
    "executions": {
        "en": "Latest executions, newest first",
        "ko": "최근 실행, 최신순",
    },
    "no_executions": {
        "en": "No execution in the last 30 days",
        "ko": "최근 30일 동안 실행 기록이 없습니다",
    },
    "started": {"en": "Started", "ko": "시작 시각"},
    "took": {"en": "took", "ko": "소요"},
    "job_steps_run": {"en": "Steps run", "ko": "실행된 단계"},
    "error": {"en": "Error", "ko": "오류"},
    "attempts": {"en": "{n} attempts", "ko": "{n}회 시도"},
    "run_SUCCEEDED": {"en": "Succeeded", "ko": "성공"},
    "run_FAILED": {"en": "Failed", "ko": "실패"},
    "run_RUNNING": {"en": "Running", "ko": "실행 중"},
    "run_TIMED_OUT": {"en": "Timed out", "ko": "시간 초과"},
    "run_ABORTED": {"en": "Stopped", "ko": "중단됨"},
    "run_WAITING": {"en": "Waiting", "ko": "대기 중"},
    "run_CAUGHT": {"en": "Failed, caught", "ko": "실패 (처리됨)"},
    "run_REPEAT_LIMIT": {"en": "Repeat limit", "ko": "반복 한도 초과"},
    "run_SKIPPED": {"en": "Skipped", "ko": "건너뜀"},
    "run_PENDING": {"en": "Pending", "ko": "대기 전"},
    "run_STOPPED": {"en": "Stopped", "ko": "중단됨"},
    "run_SKIPPED_OVERLAP": {
        "en": "Skipped: already running",
        "ko": "건너뜀: 이미 실행 중",
    },
    "job_changed": {
        "en": "The job changed since this page was read; nothing was changed.",
        "ko": "이 페이지를 연 뒤 작업이 변경되었습니다. 변경된 내용이 없습니다.",
    },
    "job_refused": {
        "en": "Not changed (the server answered {status}).",
        "ko": "변경하지 못했습니다 (서버 응답 {status}).",
    },
    "reload": {"en": "Reload", "ko": "새로고침"},
}


def labels(lang: Lang) -> dict[str, str]:
    return {key: text[lang] for key, text in LABELS.items()}


def pick_lang(query: str | None, cookie: str | None, accept_language: str | None) -> Lang:
    for choice in (query, cookie):
        if choice in LANGS:
            return choice
    return from_accept_language(accept_language or "")


def from_accept_language(header: str) -> Lang:
    """The supported language the browser prefers most (``ko-KR,ko;q=0.9,en;q=0.8``)."""
    best: tuple[float, int, Lang] | None = None
    for position, part in enumerate(header.split(",")):
        tag, _, params = part.strip().partition(";")
        primary = tag.strip().lower().split("-")[0]
        if primary not in LANGS:
            continue
        q = 1.0
        for param in params.split(";"):
            name, _, value = param.strip().partition("=")
            if name == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        if q > 0 and (best is None or (q, -position) > (best[0], best[1])):
            best = (q, -position, primary)
    return best[2] if best else "en"
