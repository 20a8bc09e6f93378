// S3 (REST, path-style: /{bucket}/{key}): buckets and their current objects, kept in memory.
// Followed: CreateBucket, HeadBucket, DeleteBucket, Get/PutBucketVersioning, the lifecycle and
// public access block configurations (stored as sent, returned as stored, never applied),
// GetBucketLocation, ListObjectsV2, and PutObject (If-None-Match: * -> 412; Content-MD5,
// x-amz-content-sha256 and x-amz-checksum-{sha256,sha1,crc32,crc32c} verified against the body,
// the checksum kept), GetObject (whole, or one bytes=FIRST-LAST range), HeadObject (the
// checksum with x-amz-checksum-mode: ENABLED),
// DeleteObject. A versioned bucket answers with version ids but keeps only the current version.
// Any other operation, sub-resource, query parameter or x-amz-* header is refused as Unsupported.

import { randomBytes } from 'node:crypto';
import { DIGESTS, md5Base64, md5Hex, sha256Hex } from './checksums.mjs';
import { Unsupported, compareStrings } from './values.mjs';

const NS = 'http://s3.amazonaws.com/doc/2006-03-01/';
const BUCKET_NAME = /^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$/;
// headers every request may carry (signing, SDK bookkeeping); any other x-amz-* is refused
const BASE_AMZ = new Set(['x-amz-date', 'x-amz-content-sha256', 'x-amz-security-token', 'x-amz-user-agent']);
const PUT_AMZ = new Set(['x-amz-sdk-checksum-algorithm', 'x-amz-checksum-type']);
const KEPT_HEADERS = ['cache-control', 'content-disposition', 'content-encoding', 'content-language', 'expires'];
const CONDITIONAL = ['if-match', 'if-modified-since', 'if-unmodified-since'];

// GetObject with Range: bytes=FIRST-LAST (the one form AEGIS sends): 206 with the bytes from
// FIRST to LAST or the end of the object, whichever comes first; 416 InvalidRange when FIRST is
// not a byte of the object (an empty object has none). Other forms are refused as Unsupported.
function ranged(range, body, headers) {
  const m = /^bytes=(\d+)-(\d+)$/.exec(range);
  if (!m) throw new Unsupported(`S3 GetObject Range: ${range}`);
  const first = Number(m[1]);
  const last = Math.min(Number(m[2]), body.length - 1);
  if (first > Number(m[2])) throw new Unsupported(`S3 GetObject Range: ${range}`);
  if (first >= body.length) {
    throw new S3Error(416, 'InvalidRange', 'The requested range is not satisfiable', {
      RangeRequested: range,
      ActualObjectSize: String(body.length),
    });
  }
  const part = body.subarray(first, last + 1);
  return {
    status: 206,
    headers: { ...headers, 'content-length': String(part.length), 'content-range': `bytes ${first}-${last}/${body.length}` },
    body: part,
  };
}

export class S3Error extends Error {
  constructor(status, code, message, extra = {}) {
    super(message);
    this.status = status;
    this.code = code;
    this.extra = extra;
  }
}

const escape = (text) => String(text).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);

function xml(root, inner) {
  return `<?xml version="1.0" encoding="UTF-8"?>\n<${root} xmlns="${NS}">${inner}</${root}>`;
}

export function errorXml(err, resource, requestId) {
  const extra = Object.entries(err.extra).map(([k, v]) => `<${k}>${escape(v)}</${k}>`).join('');
  return `<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>${err.code}</Code><Message>${escape(err.message)}</Message>${extra}<Resource>${escape(resource)}</Resource><RequestId>${requestId}</RequestId></Error>`;
}

function noSuchBucket(name) {
  return new S3Error(404, 'NoSuchBucket', 'The specified bucket does not exist', { BucketName: name });
}

/** The operation a request asks for (its counter's name), or Unsupported. */
export function route(method, bucket, key, query) {
  const params = [...query.keys()].filter((k) => k !== 'x-id');
  const has = (name) => params.length === 1 && params[0] === name;
  const none = params.length === 0;
  if (bucket === '') throw new Unsupported(`S3 ${method} / (ListBuckets)`);
  if (key === '') {
    if (method === 'HEAD' && none) return 'HeadBucket';
    if (method === 'PUT' && none) return 'CreateBucket';
    if (method === 'DELETE' && none) return 'DeleteBucket';
    if (method === 'PUT' && has('versioning')) return 'PutBucketVersioning';
    if (method === 'GET' && has('versioning')) return 'GetBucketVersioning';
    if (method === 'PUT' && has('lifecycle')) return 'PutBucketLifecycleConfiguration';
    if (method === 'GET' && has('lifecycle')) return 'GetBucketLifecycleConfiguration';
    if (method === 'PUT' && has('publicAccessBlock')) return 'PutPublicAccessBlock';
    if (method === 'GET' && has('publicAccessBlock')) return 'GetPublicAccessBlock';
    if (method === 'GET' && has('location')) return 'GetBucketLocation';
    if (method === 'GET' && query.get('list-type') === '2') return 'ListObjectsV2';
    throw new Unsupported(`S3 ${method} bucket${params.length ? ` ?${params.join('&')}` : ''}`);
  }
  if (none && method === 'PUT') return 'PutObject';
  if (none && method === 'GET') return 'GetObject';
  if (none && method === 'HEAD') return 'HeadObject';
  if (none && method === 'DELETE') return 'DeleteObject';
  throw new Unsupported(`S3 ${method} object${params.length ? ` ?${params.join('&')}` : ''}`);
}

function checkHeaders(op, headers, allowed = new Set()) {
  for (const name of Object.keys(headers)) {
    if (name.startsWith('x-amz-') && !BASE_AMZ.has(name) && !allowed.has(name) && !(op === 'PutObject' && (name.startsWith('x-amz-meta-') || name.startsWith('x-amz-checksum-')))) {
      throw new Unsupported(`S3 ${op} header ${name}`);
    }
  }
  const sha = headers['x-amz-content-sha256'];
  if (sha && sha.startsWith('STREAMING-')) throw new Unsupported(`S3 ${op} x-amz-content-sha256: ${sha} (aws-chunked uploads)`);
  if ((headers['content-encoding'] || '').includes('aws-chunked')) throw new Unsupported(`S3 ${op} Content-Encoding: aws-chunked`);
}

function checkPayloadHash(headers, body) {
  const sha = headers['x-amz-content-sha256'];
  if (sha && /^[0-9a-f]{64}$/.test(sha) && sha !== sha256Hex(body)) {
    throw new S3Error(400, 'XAmzContentSHA256Mismatch', "The provided 'x-amz-content-sha256' header does not match what was computed.", {
      ClientComputedContentSHA256: sha,
      S3ComputedContentSHA256: sha256Hex(body),
    });
  }
}

export class S3 {
  constructor(region) {
    this.region = region;
    this.buckets = new Map();
  }

  bucket(name) {
    const bucket = this.buckets.get(name);
    if (!bucket) throw noSuchBucket(name);
    return bucket;
  }

  /** Answer ``op``: { status, headers, body } or an S3Error / Unsupported thrown. */
  handle(op, { bucket, key, query, headers, body, region }) {
    switch (op) {
      case 'HeadBucket':
        checkHeaders(op, headers);
        if (!this.buckets.has(bucket)) throw new S3Error(404, 'NoSuchBucket', '');
        return { status: 200, headers: { 'x-amz-bucket-region': this.buckets.get(bucket).region } };
      case 'CreateBucket': {
        checkHeaders(op, headers);
        checkPayloadHash(headers, body);
        if (!BUCKET_NAME.test(bucket)) throw new S3Error(400, 'InvalidBucketName', 'The specified bucket is not valid.', { BucketName: bucket });
        if (this.buckets.has(bucket)) throw new S3Error(409, 'BucketAlreadyOwnedByYou', 'Your previous request to create the named bucket succeeded and you already own it.', { BucketName: bucket });
        const text = body.toString('utf8');
        const location = /<LocationConstraint>([^<]*)<\/LocationConstraint>/.exec(text);
        this.buckets.set(bucket, {
          region: location ? location[1] : 'us-east-1',
          versioning: undefined,
          objects: new Map(),
          sorted: null,
          lifecycle: undefined,
          publicAccessBlock: undefined,
        });
        return { status: 200, headers: { location: `/${bucket}` } };
      }
      case 'DeleteBucket': {
        checkHeaders(op, headers);
        const b = this.bucket(bucket);
        if (b.objects.size) throw new S3Error(409, 'BucketNotEmpty', 'The bucket you tried to delete is not empty', { BucketName: bucket });
        this.buckets.delete(bucket);
        return { status: 204 };
      }
      case 'GetBucketVersioning': {
        checkHeaders(op, headers);
        const b = this.bucket(bucket);
        return { status: 200, xml: xml('VersioningConfiguration', b.versioning ? `<Status>${b.versioning}</Status>` : '') };
      }
      case 'PutBucketVersioning': {
        checkHeaders(op, headers, new Set(['x-amz-sdk-checksum-algorithm', 'x-amz-checksum-crc32', 'x-amz-checksum-crc32c', 'x-amz-checksum-sha256', 'x-amz-checksum-sha1']));
        const b = this.bucket(bucket);
        verifyChecksums(op, headers, body);
        const text = body.toString('utf8');
        if (text.includes('<MfaDelete>')) throw new Unsupported('S3 PutBucketVersioning MfaDelete');
        const status = /<Status>(Enabled|Suspended)<\/Status>/.exec(text);
        if (!status) throw new S3Error(400, 'MalformedXML', 'The XML you provided was not well-formed or did not validate against our published schema');
        b.versioning = status[1];
        return { status: 200 };
      }
      case 'PutBucketLifecycleConfiguration':
      case 'PutPublicAccessBlock': {
        checkHeaders(op, headers, new Set(['x-amz-sdk-checksum-algorithm', 'x-amz-checksum-crc32', 'x-amz-checksum-crc32c', 'x-amz-checksum-sha256', 'x-amz-checksum-sha1', 'x-amz-transition-default-minimum-object-size']));
        const b = this.bucket(bucket);
        verifyChecksums(op, headers, body);
        const root = op === 'PutPublicAccessBlock' ? 'PublicAccessBlockConfiguration' : 'LifecycleConfiguration';
        const text = body.toString('utf8');
        if (!text.includes(`<${root}`)) throw new S3Error(400, 'MalformedXML', 'The XML you provided was not well-formed or did not validate against our published schema');
        if (op === 'PutPublicAccessBlock') b.publicAccessBlock = text;
        else b.lifecycle = text;
        return { status: 200 };
      }
      case 'GetBucketLifecycleConfiguration': {
        checkHeaders(op, headers);
        const b = this.bucket(bucket);
        if (!b.lifecycle) throw new S3Error(404, 'NoSuchLifecycleConfiguration', 'The lifecycle configuration does not exist', { BucketName: bucket });
        return { status: 200, xml: b.lifecycle };
      }
      case 'GetPublicAccessBlock': {
        checkHeaders(op, headers);
        const b = this.bucket(bucket);
        if (!b.publicAccessBlock) throw new S3Error(404, 'NoSuchPublicAccessBlockConfiguration', 'The public access block configuration was not found', { BucketName: bucket });
        return { status: 200, xml: b.publicAccessBlock };
      }
      case 'GetBucketLocation': {
        checkHeaders(op, headers);
        const b = this.bucket(bucket);
        return { status: 200, xml: xml('LocationConstraint', b.region === 'us-east-1' ? '' : escape(b.region)) };
      }
      case 'ListObjectsV2':
        checkHeaders(op, headers);
        return this.list(this.bucket(bucket), bucket, query);
      case 'PutObject':
        return this.put(bucket, key, headers, body);
      case 'GetObject':
      case 'HeadObject':
        return this.get(op, bucket, key, headers);
      case 'DeleteObject': {
        checkHeaders(op, headers);
        const b = this.bucket(bucket);
        if (b.objects.delete(key)) b.sorted = null;
        return { status: 204, headers: b.versioning === 'Enabled' ? { 'x-amz-delete-marker': 'true', 'x-amz-version-id': versionId() } : {} };
      }
      default:
        throw new Unsupported(`S3 operation ${op}`);
    }
  }

  put(bucketName, key, headers, body) {
    const op = 'PutObject';
    checkHeaders(op, headers, PUT_AMZ);
    for (const h of [...CONDITIONAL, 'range']) if (headers[h] !== undefined) throw new Unsupported(`S3 PutObject header ${h}`);
    const ifNoneMatch = headers['if-none-match'];
    if (ifNoneMatch !== undefined && ifNoneMatch !== '*') throw new Unsupported(`S3 PutObject If-None-Match: ${ifNoneMatch} (only * is followed)`);
    const b = this.bucket(bucketName);
    if (Buffer.byteLength(key) > 1024) throw new S3Error(400, 'KeyTooLongError', 'Your key is too long');
    checkPayloadHash(headers, body);
    const checksums = verifyChecksums(op, headers, body);
    if (ifNoneMatch === '*' && b.objects.has(key)) {
      throw new S3Error(412, 'PreconditionFailed', 'At least one of the pre-conditions you specified did not hold', { Condition: 'If-None-Match' });
    }
    const meta = {};
    for (const [name, value] of Object.entries(headers)) if (name.startsWith('x-amz-meta-')) meta[name] = value;
    const kept = {};
    for (const h of KEPT_HEADERS) if (headers[h] !== undefined) kept[h] = headers[h];
    const object = {
      body,
      etag: `"${md5Hex(body)}"`,
      contentType: headers['content-type'] || 'binary/octet-stream',
      meta,
      kept,
      checksums,
      lastModified: new Date(Math.floor(Date.now() / 1000) * 1000),
      versionId: b.versioning === 'Enabled' ? versionId() : b.versioning === 'Suspended' ? 'null' : undefined,
    };
    if (!b.objects.has(key)) b.sorted = null;
    b.objects.set(key, object);
    const out = { etag: object.etag };
    if (object.versionId) out['x-amz-version-id'] = object.versionId;
    for (const [alg, value] of Object.entries(checksums)) {
      out[`x-amz-checksum-${alg}`] = value;
      out['x-amz-checksum-type'] = 'FULL_OBJECT';
    }
    return { status: 200, headers: out };
  }

  get(op, bucketName, key, headers) {
    checkHeaders(op, headers, new Set(['x-amz-checksum-mode']));
    for (const h of [...CONDITIONAL, 'if-none-match']) if (headers[h] !== undefined) throw new Unsupported(`S3 ${op} header ${h}`);
    const range = headers.range;
    if (range !== undefined && op !== 'GetObject') throw new Unsupported(`S3 ${op} header range`);
    const mode = headers['x-amz-checksum-mode'];
    if (range !== undefined && mode !== undefined) throw new Unsupported(`S3 ${op} range with x-amz-checksum-mode`);
    if (mode !== undefined && mode !== 'ENABLED') throw new S3Error(400, 'InvalidArgument', 'x-amz-checksum-mode must be ENABLED');
    const b = this.bucket(bucketName);
    const object = b.objects.get(key);
    if (!object) throw new S3Error(404, 'NoSuchKey', 'The specified key does not exist.', { Key: key });
    const out = {
      'content-type': object.contentType,
      'content-length': String(object.body.length),
      etag: object.etag,
      'last-modified': object.lastModified.toUTCString(),
      'accept-ranges': 'bytes',
      ...object.meta,
      ...object.kept,
    };
    if (object.versionId) out['x-amz-version-id'] = object.versionId;
    if (mode === 'ENABLED') {
      for (const [alg, value] of Object.entries(object.checksums)) {
        out[`x-amz-checksum-${alg}`] = value;
        out['x-amz-checksum-type'] = 'FULL_OBJECT';
      }
    }
    if (range !== undefined) return ranged(range, object.body, out);
    return { status: 200, headers: out, body: op === 'GetObject' ? object.body : undefined };
  }

  list(b, bucketName, query) {
    for (const k of query.keys()) {
      if (!['list-type', 'prefix', 'delimiter', 'max-keys', 'start-after', 'continuation-token', 'encoding-type', 'x-id', 'fetch-owner'].includes(k)) {
        throw new Unsupported(`S3 ListObjectsV2 parameter ${k}`);
      }
    }
    if (query.get('fetch-owner') === 'true') throw new Unsupported('S3 ListObjectsV2 fetch-owner=true');
    const prefix = query.get('prefix') || '';
    const delimiter = query.get('delimiter') || '';
    const startAfter = query.get('start-after') || '';
    const encoding = query.get('encoding-type');
    if (encoding !== null && encoding !== 'url') throw new S3Error(400, 'InvalidArgument', 'Invalid Encoding Method specified in Request');
    const maxKeys = Math.min(1000, query.has('max-keys') ? Number.parseInt(query.get('max-keys'), 10) : 1000);
    if (!(maxKeys >= 0)) throw new S3Error(400, 'InvalidArgument', 'Provided max-keys not an integer or within integer range');
    let after = startAfter;
    let skipPrefix = '';
    const token = query.get('continuation-token');
    if (token !== null) {
      try {
        ({ after, skipPrefix } = JSON.parse(Buffer.from(token, 'base64url').toString('utf8')));
      } catch {
        throw new S3Error(400, 'InvalidArgument', 'The continuation token provided is incorrect');
      }
    }
    if (!b.sorted) b.sorted = [...b.objects.keys()].sort(compareStrings);
    const keys = b.sorted;
    // the first key after ``after`` and not before ``prefix``
    const from = compareStrings(after, prefix) >= 0 ? after : prefix;
    let lo = 0;
    let hi = keys.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      const c = compareStrings(keys[mid], from);
      if (c < 0 || (c === 0 && from === after && after !== '')) lo = mid + 1;
      else hi = mid;
    }
    const enc = encoding === 'url' ? (s) => encodeURIComponent(s).replace(/%2F/g, '/') : (s) => s;
    const contents = [];
    const prefixes = [];
    let count = 0;
    let truncated = false;
    let next;
    let last;
    for (let i = lo; i < keys.length; i++) {
      const key = keys[i];
      if (!key.startsWith(prefix)) break;
      if (skipPrefix && key.startsWith(skipPrefix)) continue;
      let common;
      if (delimiter) {
        const at = key.indexOf(delimiter, prefix.length);
        if (at >= 0) common = key.slice(0, at + delimiter.length);
      }
      if (common !== undefined && prefixes[prefixes.length - 1] === common) continue;
      if (count >= maxKeys) {
        truncated = true;
        next = Buffer.from(JSON.stringify(last), 'utf8').toString('base64url');
        break;
      }
      count += 1;
      if (common !== undefined) {
        prefixes.push(common);
        last = { after: key, skipPrefix: common };
      } else {
        const o = b.objects.get(key);
        contents.push(`<Contents><Key>${escape(enc(key))}</Key><LastModified>${o.lastModified.toISOString()}</LastModified><ETag>${escape(o.etag)}</ETag><Size>${o.body.length}</Size><StorageClass>STANDARD</StorageClass></Contents>`);
        last = { after: key, skipPrefix: '' };
      }
    }
    let inner = `<Name>${escape(bucketName)}</Name><Prefix>${escape(enc(prefix))}</Prefix><KeyCount>${count}</KeyCount><MaxKeys>${maxKeys}</MaxKeys>`;
    if (delimiter) inner += `<Delimiter>${escape(enc(delimiter))}</Delimiter>`;
    inner += `<IsTruncated>${truncated}</IsTruncated>`;
    if (encoding) inner += `<EncodingType>${encoding}</EncodingType>`;
    if (token !== null) inner += `<ContinuationToken>${escape(token)}</ContinuationToken>`;
    if (next) inner += `<NextContinuationToken>${next}</NextContinuationToken>`;
    if (startAfter) inner += `<StartAfter>${escape(enc(startAfter))}</StartAfter>`;
    inner += contents.join('') + prefixes.map((p) => `<CommonPrefixes><Prefix>${escape(enc(p))}</Prefix></CommonPrefixes>`).join('');
    return { status: 200, xml: xml('ListBucketResult', inner) };
  }
}

function versionId() {
  return randomBytes(24).toString('base64url');
}

/** The request's checksums, verified against the body ({algorithm: base64}). */
function verifyChecksums(op, headers, body) {
  const md5 = headers['content-md5'];
  if (md5 !== undefined) {
    if (Buffer.from(md5, 'base64').length !== 16) throw new S3Error(400, 'InvalidDigest', 'The Content-MD5 you specified was invalid.');
    if (md5 !== md5Base64(body)) throw new S3Error(400, 'BadDigest', 'The Content-MD5 you specified did not match what we received.');
  }
  const given = Object.keys(headers).filter((h) => h.startsWith('x-amz-checksum-') && h !== 'x-amz-checksum-type' && h !== 'x-amz-checksum-mode');
  if (given.length > 1) throw new S3Error(400, 'InvalidRequest', 'Expecting a single x-amz-checksum- header. Multiple checksum Types are not allowed.');
  const announced = headers['x-amz-sdk-checksum-algorithm'];
  if (announced && !given.includes(`x-amz-checksum-${announced.toLowerCase()}`)) {
    throw new Unsupported(`S3 ${op} x-amz-sdk-checksum-algorithm ${announced} without its x-amz-checksum- header (a trailer)`);
  }
  const out = {};
  for (const header of given) {
    const alg = header.slice('x-amz-checksum-'.length);
    const digest = DIGESTS[alg];
    if (!digest) throw new Unsupported(`S3 ${op} checksum ${header}`);
    if (headers[header] !== digest(body)) {
      throw new S3Error(400, 'BadDigest', `The ${alg.toUpperCase()} you specified did not match the calculated checksum.`);
    }
    out[alg] = headers[header];
  }
  return out;
}
