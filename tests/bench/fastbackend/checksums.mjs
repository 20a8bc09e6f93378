// The checksums S3 verifies on upload: x-amz-checksum-{sha256,sha1,crc32,crc32c} and
// Content-MD5 (node 20 has no zlib.crc32, hence the tables). crc64nvme is not followed.

import { createHash } from 'node:crypto';

function table(polynomial) {
  const out = new Uint32Array(256);
  for (let n = 0; n < 256; n++) {
    let c = n;
    for (let k = 0; k < 8; k++) c = c & 1 ? polynomial ^ (c >>> 1) : c >>> 1;
    out[n] = c >>> 0;
  }
  return out;
}

const CRC32 = table(0xedb88320);
const CRC32C = table(0x82f63b78);

function crc(body, t) {
  let c = 0xffffffff;
  for (let i = 0; i < body.length; i++) c = t[(c ^ body[i]) & 0xff] ^ (c >>> 8);
  const out = Buffer.alloc(4);
  out.writeUInt32BE((c ^ 0xffffffff) >>> 0);
  return out.toString('base64');
}

/** base64 digest of ``body`` by algorithm name; undefined for one not followed. */
export const DIGESTS = {
  sha256: (body) => createHash('sha256').update(body).digest('base64'),
  sha1: (body) => createHash('sha1').update(body).digest('base64'),
  crc32: (body) => crc(body, CRC32),
  crc32c: (body) => crc(body, CRC32C),
};

export const md5Base64 = (body) => createHash('md5').update(body).digest('base64');
export const md5Hex = (body) => createHash('md5').update(body).digest('hex');
export const sha256Hex = (body) => createHash('sha256').update(body).digest('hex');
