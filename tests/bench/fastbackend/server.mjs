#!/usr/bin/env node
// A bench-only S3 and DynamoDB responder: enough of both, kept in memory, for AEGIS's ingest and
// processor to run from start-up to steady state against it, fast enough not to be the limit of
// what one replica of each sustains (moto_server, one Python core, is). NOT an emulator for tests
// of behaviour: tests/integration/test_fastbackend.py keeps it honest for the calls AEGIS makes.
//
// - No request signature is checked: any credentials are accepted.
// - What it follows is listed in s3.mjs and dynamodb.mjs; every other operation, parameter,
//   header or expression form is refused loudly (HTTP 501 NotImplemented naming it, a counter,
//   a line on stderr), never answered with a silent success.
// - Connections are kept alive, as AWS keeps them.
// - --rtt-ms N models a network round trip: every request waits N/2 ms before it is applied and
//   N/2 ms before it is answered (timers: requests wait together, none holds another up). A
//   request sent with Expect: 100-continue (botocore's PutObject) gets its 100 Continue after a
//   whole round trip more, as the client then waits for it before sending the body.
// - Requests are applied one at a time on the event loop, so conditional writes are atomic.
// - Counters per operation (served, refused, errors by code): GET /_fast/counters, and printed
//   as one JSON line on stdout when stopped (SIGTERM, SIGINT). GET /_fast/ready says it is up.
//   (A bucket name cannot start with "_", so these paths are no S3 requests.)
//
// node server.mjs --port 4599 [--host 127.0.0.1] [--rtt-ms 10] [--region ap-south-1]

import http from 'node:http';
import { parseArgs } from 'node:util';
import { DynamoDB, requestId } from './dynamodb.mjs';
import { S3, S3Error, errorXml, route } from './s3.mjs';
import { DynamoError, Unsupported } from './values.mjs';

const { values: args } = parseArgs({
  options: {
    port: { type: 'string' },
    host: { type: 'string', default: '127.0.0.1' },
    'rtt-ms': { type: 'string', default: '0' },
    region: { type: 'string', default: 'ap-south-1' },
  },
});
if (!args.port) {
  process.stderr.write('fastbackend: --port is required\n');
  process.exit(2);
}
const HALF_RTT = Number(args['rtt-ms']) / 2;
const DDB_TARGET = 'DynamoDB_20120810.';
const DDB_ERROR = 'com.amazonaws.dynamodb.v20120810#';

const s3 = new S3(args.region);
const dynamodb = new DynamoDB();
const started = Date.now();
const counters = { ops: {}, connections: 0, continues: 0, refusals: [], internal: 0 };

function count(op, outcome, code) {
  let c = counters.ops[op];
  if (!c) {
    c = { served: 0, refused: 0, errors: {} };
    counters.ops[op] = c;
  }
  if (outcome === 'refused') c.refused += 1;
  else c.served += 1;
  if (code) c.errors[code] = (c.errors[code] || 0) + 1;
}

function refuse(op, err) {
  count(op, 'refused', 'NotImplemented');
  const message = `fastbackend does not follow: ${err.what}`;
  if (counters.refusals.length < 100) counters.refusals.push(message);
  process.stderr.write(`${new Date().toISOString()} REFUSED ${op}: ${err.what}\n`);
  return message;
}

function internal(op, err) {
  counters.internal += 1;
  count(op, 'refused', 'InternalError');
  process.stderr.write(`${new Date().toISOString()} INTERNAL ERROR ${op}: ${err.stack}\n`);
}

function snapshot() {
  return { ...counters, uptime_s: (Date.now() - started) / 1000, rtt_ms: HALF_RTT * 2 };
}

const wait = () => new Promise((resolve) => setTimeout(resolve, HALF_RTT));

function regionOf(headers) {
  const m = /Credential=[^/]+\/\d{8}\/([^/]+)\//.exec(headers.authorization || '');
  return m ? m[1] : args.region;
}

function answerDynamo(req, body) {
  const target = req.headers['x-amz-target'];
  const op = target.startsWith(DDB_TARGET) ? target.slice(DDB_TARGET.length) : target;
  const id = requestId();
  const reply = (status, payload) => ({
    status,
    headers: { 'content-type': 'application/x-amz-json-1.0', 'x-amzn-requestid': id },
    body: JSON.stringify(payload),
  });
  if (!target.startsWith(DDB_TARGET)) {
    return reply(501, { __type: `${DDB_ERROR}NotImplemented`, message: refuse(op, new Unsupported(`X-Amz-Target ${target}`)) });
  }
  let request;
  try {
    request = JSON.parse(body.length ? body.toString('utf8') : '{}');
  } catch {
    count(op, 'served', 'SerializationException');
    return reply(400, { __type: `${DDB_ERROR}SerializationException`, message: 'Start of structure or map found where not expected' });
  }
  try {
    const out = dynamodb.handle(op, request, regionOf(req.headers));
    count(op, 'served');
    return reply(200, out);
  } catch (err) {
    if (err instanceof DynamoError) {
      count(op, 'served', err.type);
      return reply(err.status, { __type: `${DDB_ERROR}${err.type}`, message: err.message, ...(err.extra || {}) });
    }
    if (err instanceof Unsupported) return reply(501, { __type: `${DDB_ERROR}NotImplemented`, message: refuse(op, err) });
    internal(op, err);
    return reply(500, { __type: `${DDB_ERROR}InternalServerError`, message: String(err) });
  }
}

function answerS3(req, body) {
  const id = requestId();
  const [rawPath, rawQuery = ''] = req.url.split('?', 2);
  const path = rawPath.slice(1);
  const slash = path.indexOf('/');
  let bucket;
  let key;
  try {
    bucket = decodeURIComponent(slash < 0 ? path : path.slice(0, slash));
    key = slash < 0 ? '' : decodeURIComponent(path.slice(slash + 1));
  } catch {
    bucket = '';
    key = '';
  }
  const query = new URLSearchParams(rawQuery);
  const head = req.method === 'HEAD';
  const base = { 'x-amz-request-id': id, 'x-amz-id-2': id };
  const xmlReply = (status, xmlBody, headers = {}) => ({
    status,
    headers: { ...base, 'content-type': 'application/xml', ...headers },
    body: head ? undefined : xmlBody,
  });
  let op = `S3 ${req.method}`;
  try {
    op = route(req.method, bucket, key, query);
    const out = s3.handle(op, { bucket, key, query, headers: req.headers, body, region: regionOf(req.headers) });
    count(op, 'served');
    if (out.xml !== undefined) return xmlReply(out.status, out.xml, out.headers);
    return { status: out.status, headers: { ...base, ...(out.headers || {}) }, body: out.body };
  } catch (err) {
    const resource = `/${bucket}${key ? `/${key}` : ''}`;
    if (err instanceof S3Error) {
      count(op, 'served', err.code);
      return xmlReply(err.status, errorXml(err, resource, id));
    }
    if (err instanceof Unsupported) {
      const message = refuse(op, err);
      return xmlReply(501, errorXml(new S3Error(501, 'NotImplemented', message), resource, id));
    }
    internal(op, err);
    return xmlReply(500, errorXml(new S3Error(500, 'InternalError', String(err)), resource, id));
  }
}

function admin(req, res) {
  if (req.url === '/_fast/ready') {
    res.writeHead(200, { 'content-type': 'text/plain' });
    res.end('ready\n');
  } else if (req.url === '/_fast/counters') {
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(JSON.stringify(snapshot()));
  } else {
    res.writeHead(404, { 'content-type': 'text/plain' });
    res.end(`no admin path ${req.url}\n`);
  }
}

const server = http.createServer((req, res) => {
  if (req.url.startsWith('/_fast/')) {
    req.resume();
    req.on('end', () => admin(req, res));
    return;
  }
  const chunks = [];
  req.on('data', (chunk) => chunks.push(chunk));
  req.on('end', async () => {
    const body = chunks.length === 1 ? chunks[0] : Buffer.concat(chunks);
    if (HALF_RTT > 0) await wait(); // the request's way there
    const out = req.headers['x-amz-target'] !== undefined ? answerDynamo(req, body) : answerS3(req, body);
    if (HALF_RTT > 0) await wait(); // the answer's way back
    if (out.body !== undefined && out.headers['content-length'] === undefined) {
      out.headers['content-length'] = String(Buffer.byteLength(out.body));
    } else if (out.body === undefined && out.headers['content-length'] === undefined) {
      out.headers['content-length'] = '0';
    }
    res.writeHead(out.status, out.headers);
    res.end(req.method === 'HEAD' ? undefined : out.body);
  });
});
server.keepAliveTimeout = 120_000;
server.headersTimeout = 125_000;
server.requestTimeout = 0;
// the headers' way there and the 100 Continue's way back, before the body is sent
server.on('checkContinue', (req, res) => {
  counters.continues += 1;
  const go = () => {
    res.writeContinue();
    server.emit('request', req, res);
  };
  if (HALF_RTT > 0) setTimeout(go, 2 * HALF_RTT);
  else go();
});
server.on('connection', () => {
  counters.connections += 1;
});

function stop() {
  process.stdout.write(`${JSON.stringify({ counters: snapshot() })}\n`);
  server.close();
  server.closeAllConnections();
  process.exit(0);
}
process.on('SIGTERM', stop);
process.on('SIGINT', stop);

server.listen(Number(args.port), args.host, () => {
  process.stdout.write(`fastbackend listening on http://${args.host}:${args.port} (round trip ${HALF_RTT * 2} ms)\n`);
});
