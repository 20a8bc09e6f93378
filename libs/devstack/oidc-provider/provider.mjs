// A real OpenID Connect provider for tests (panva's oidc-provider, the certified Node.js
// implementation), driven over HTTP without a browser: started by
// aegis_devstack.testing.oidc with its configuration as the one argument (JSON):
//
//   {"port": 20123, "issuer": "http://127.0.0.1:20123",
//    "clients": [{"client_id", "client_secret", "redirect_uris", "post_logout_redirect_uris"}],
//    "users": [{"account_id", "name", "email", "groups"}],
//    "ttl": {"IdToken": 60, "Session": 600, ...}}
//
// Sign-in is a dev-style form: GET /interaction/{uid} shows it, POST /interaction/{uid}/login
// with `login={account_id}` signs that account in (an unknown one: 400, the form again). Consent
// is granted at once (the scopes and claims the client asked for). Every authorization needs
// PKCE (S256), so a client that does not send it is refused, as the dashboard must never be.

import { generateKeyPairSync, randomBytes } from 'node:crypto';
import http from 'node:http';

const config = JSON.parse(process.argv[2]);

// `make test-at` moves every Python clock of the suite (TEST_CLOCK_OFFSET_S); the tokens this
// provider signs must be dated on the same clock, or the dashboard would find them expired
// (or not yet valid). Set before oidc-provider is loaded: it and jose read Date as they run.
const offsetMs = Number(process.env.TEST_CLOCK_OFFSET_S || 0) * 1000;
if (offsetMs) {
  const RealDate = Date;
  globalThis.Date = class extends RealDate {
    constructor(...args) {
      if (args.length === 0) super(RealDate.now() + offsetMs);
      else super(...args);
    }

    static now() {
      return RealDate.now() + offsetMs;
    }
  };
}

// each step of the start is logged with its time, so a start that did not finish says where
const started = performance.now();
const step = (what) => console.log(`oidc provider: ${what} (${Math.round(performance.now() - started)} ms)`);

step('loading oidc-provider');
const { default: Provider } = await import('oidc-provider');

const accounts = new Map(config.users.map((user) => [user.account_id, user]));
step('making the signing key');
const { privateKey } = generateKeyPairSync('rsa', { modulusLength: 2048 });
step('configuring');
const signingKey = { ...privateKey.export({ format: 'jwk' }), kid: 'test-key', use: 'sig', alg: 'RS256' };

function page(title, body) {
  return `<!doctype html><html><head><meta charset="utf-8"><title>${title}</title></head>`
    + `<body><h1>${title}</h1>${body}</body></html>`;
}

function escape(text) {
  return String(text).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

const provider = new Provider(config.issuer, {
  clients: config.clients.map((client) => ({
    client_id: client.client_id,
    client_secret: client.client_secret,
    redirect_uris: client.redirect_uris,
    post_logout_redirect_uris: client.post_logout_redirect_uris || [],
    grant_types: ['authorization_code'],
    response_types: ['code'],
    token_endpoint_auth_method: 'client_secret_basic',
  })),
  jwks: { keys: [signingKey] },
  cookies: { keys: [randomBytes(32).toString('hex')] },
  // `groups` is a scope of its own whose claim lists the account's groups, as providers that
  // send groups do (Keycloak's group mapper, Okta's groups claim)
  claims: {
    openid: ['sub'],
    profile: ['name'],
    email: ['email', 'email_verified'],
    groups: ['groups'],
  },
  async findAccount(_ctx, id) {
    const user = accounts.get(id);
    if (!user) return undefined;
    return {
      accountId: id,
      async claims() {
        return {
          sub: id,
          name: user.name,
          email: user.email,
          email_verified: true,
          groups: user.groups || [],
        };
      },
    };
  },
  interactions: { url: (_ctx, interaction) => `/interaction/${interaction.uid}` },
  features: {
    devInteractions: { enabled: false },
    rpInitiatedLogout: {
      enabled: true,
      async logoutSource(ctx, form) {
        // the provider's own form (its xsrf token) and a button that confirms: a test posts it
        ctx.body = page('Sign out', `${form}<button type="submit" form="op.logoutForm" name="logout" value="yes">Sign out</button>`);
      },
      async postLogoutSuccessSource(ctx) {
        ctx.body = page('Signed out', '<p>You are signed out.</p>');
      },
    },
  },
  pkce: { required: () => true },
  ttl: config.ttl || {},
  async renderError(ctx, out) {
    ctx.type = 'json';
    ctx.body = out;
  },
});

async function readForm(req) {
  let body = '';
  for await (const chunk of req) {
    body += chunk;
    if (body.length > 8192) throw new Error('form too large');
  }
  return new URLSearchParams(body);
}

function loginForm(res, uid, status, error) {
  res.statusCode = status;
  res.setHeader('content-type', 'text/html; charset=utf-8');
  const message = error ? `<p class="error">${escape(error)}</p>` : '';
  res.end(page('Sign in', `${message}<form method="post" action="/interaction/${uid}/login">`
    + '<label>Account <input name="login" autofocus></label><button type="submit">Sign in</button></form>'));
}

async function interaction(req, res) {
  const details = await provider.interactionDetails(req, res);
  const { uid, prompt, params, session } = details;
  if (req.method === 'POST' && req.url.endsWith('/login')) {
    const accountId = (await readForm(req)).get('login') || '';
    if (!accounts.has(accountId)) {
      loginForm(res, uid, 400, `no account ${accountId}`);
      return;
    }
    await provider.interactionFinished(req, res, { login: { accountId } }, { mergeWithLastSubmission: false });
    return;
  }
  if (prompt.name === 'consent') {
    // consent granted at once: what the client asked for, as a first-party app would get
    const grant = details.grantId
      ? await provider.Grant.find(details.grantId)
      : new provider.Grant({ accountId: session.accountId, clientId: params.client_id });
    if (prompt.details.missingOIDCScope) grant.addOIDCScope(prompt.details.missingOIDCScope.join(' '));
    if (prompt.details.missingOIDCClaims) grant.addOIDCClaims(prompt.details.missingOIDCClaims);
    for (const [indicator, scopes] of Object.entries(prompt.details.missingResourceScopes || {})) {
      grant.addResourceScope(indicator, scopes.join(' '));
    }
    const grantId = await grant.save();
    await provider.interactionFinished(req, res, { consent: { grantId } }, { mergeWithLastSubmission: true });
    return;
  }
  loginForm(res, uid, 200);
}

const callback = provider.callback();
const server = http.createServer((req, res) => {
  if (!req.url.startsWith('/interaction/')) {
    callback(req, res);
    return;
  }
  interaction(req, res).catch((err) => {
    res.statusCode = 400;
    res.setHeader('content-type', 'text/plain; charset=utf-8');
    res.end(`interaction failed: ${err.message}`);
  });
});

server.listen(config.port, '127.0.0.1', () => {
  step(`${config.issuer} ready`);
});

for (const signal of ['SIGTERM', 'SIGINT']) {
  process.on(signal, () => {
    server.close();
    server.closeAllConnections();
    process.exit(0);
  });
}
