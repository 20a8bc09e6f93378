// DynamoDB attribute values: validation, DynamoDB's canonical numbers, ordering and equality,
// decimal arithmetic (ADD, SET a = b + :c), and the item size DynamoDB limits.

export class DynamoError extends Error {
  // an error DynamoDB itself would answer (400 ValidationException, ConditionalCheckFailed, ...)
  constructor(type, message, extra = undefined, status = 400) {
    super(message);
    this.type = type;
    this.extra = extra;
    this.status = status;
  }
}

export class Unsupported extends Error {
  // something valid that this responder does not follow: refused loudly (501), never guessed
  constructor(what) {
    super(what);
    this.what = what;
  }
}

export const validation = (message) => new DynamoError('ValidationException', message);

const TYPES = new Set(['S', 'N', 'B', 'SS', 'NS', 'BS', 'M', 'L', 'NULL', 'BOOL']);
const NUMBER = /^([+-]?)(\d*)(?:\.(\d*))?(?:[eE]([+-]?\d+))?$/;

export function typeOf(value) {
  for (const key in value) return key;
  return undefined;
}

/** DynamoDB's form of a number: no exponent, no leading or trailing zeros ("24.0" -> "24"). */
export function canonicalNumber(text) {
  if (typeof text !== 'string') throw validation('A number must be given as a string');
  const m = NUMBER.exec(text);
  if (!m || (m[2] === '' && !m[3])) {
    throw validation(`The parameter cannot be converted to a numeric value: ${text}`);
  }
  const fraction = m[3] || '';
  let digits = (m[2] + fraction).replace(/^0+/, '');
  let exp = (m[4] ? Number.parseInt(m[4], 10) : 0) - fraction.length;
  if (digits === '') return '0';
  const trailing = digits.length - digits.replace(/0+$/, '').length;
  digits = digits.slice(0, digits.length - trailing);
  exp += trailing;
  if (digits.length > 38) {
    throw validation('Attempting to store more than 38 significant digits in a Number');
  }
  const magnitude = exp + digits.length - 1; // the power of ten of the first digit
  if (magnitude > 125) {
    throw validation('Number overflow. Attempting to store a number with magnitude larger than supported range');
  }
  if (magnitude < -130) {
    throw validation('Number underflow. Attempting to store a number with magnitude smaller than supported range');
  }
  let out;
  if (exp >= 0) out = digits + '0'.repeat(exp);
  else if (-exp < digits.length) out = `${digits.slice(0, digits.length + exp)}.${digits.slice(digits.length + exp)}`;
  else out = `0.${'0'.repeat(-exp - digits.length)}${digits}`;
  return (m[1] === '-' ? '-' : '') + out;
}

function scaled(canonical) {
  // a canonical number as [BigInt, decimals]
  const negative = canonical.startsWith('-');
  const [whole, fraction = ''] = (negative ? canonical.slice(1) : canonical).split('.');
  const value = BigInt(whole + fraction);
  return [negative ? -value : value, fraction.length];
}

export function compareNumbers(a, b) {
  if (a === b) return 0;
  let [x, dx] = scaled(a);
  let [y, dy] = scaled(b);
  if (dx < dy) x *= 10n ** BigInt(dy - dx);
  else if (dy < dx) y *= 10n ** BigInt(dx - dy);
  return x < y ? -1 : x > y ? 1 : 0;
}

export function addNumbers(a, b, negate = false) {
  let [x, dx] = scaled(a);
  let [y, dy] = scaled(b);
  const d = Math.max(dx, dy);
  x *= 10n ** BigInt(d - dx);
  y *= 10n ** BigInt(d - dy);
  const sum = negate ? x - y : x + y;
  const negative = sum < 0n;
  const digits = (negative ? -sum : sum).toString().padStart(d + 1, '0');
  const text = d ? `${digits.slice(0, digits.length - d)}.${digits.slice(digits.length - d)}` : digits;
  return canonicalNumber((negative ? '-' : '') + text);
}

/** Strings in DynamoDB's order: by UTF-8 bytes, which is code point order (not UTF-16 units). */
export function compareStrings(a, b) {
  if (a === b) return 0;
  const n = Math.min(a.length, b.length);
  for (let i = 0; i < n; i++) {
    let x = a.charCodeAt(i);
    let y = b.charCodeAt(i);
    if (x !== y) {
      if (x >= 0xd800 && y >= 0xd800) {
        // surrogates (code points above U+FFFF) sort after U+E000..U+FFFF
        x = x >= 0xe000 ? x - 0x800 : x + 0x2000;
        y = y >= 0xe000 ? y - 0x800 : y + 0x2000;
      }
      return x < y ? -1 : 1;
    }
  }
  return a.length < b.length ? -1 : a.length > b.length ? 1 : 0;
}

export function compareBinary(a, b) {
  return Buffer.compare(Buffer.from(a, 'base64'), Buffer.from(b, 'base64'));
}

/** Ordering of two scalar values of one type (S, N, B); undefined when they cannot be ordered. */
export function compareValues(a, b) {
  const t = typeOf(a);
  if (t !== typeOf(b)) return undefined;
  if (t === 'S') return compareStrings(a.S, b.S);
  if (t === 'N') return compareNumbers(a.N, b.N);
  if (t === 'B') return compareBinary(a.B, b.B);
  return undefined;
}

function sameSet(a, b, equal) {
  return a.length === b.length && a.every((x) => b.some((y) => equal(x, y)));
}

export function valuesEqual(a, b) {
  const t = typeOf(a);
  if (t !== typeOf(b)) return false;
  switch (t) {
    case 'S':
      return a.S === b.S;
    case 'N':
      return compareNumbers(a.N, b.N) === 0;
    case 'B':
      return compareBinary(a.B, b.B) === 0;
    case 'BOOL':
      return a.BOOL === b.BOOL;
    case 'NULL':
      return true;
    case 'SS':
      return sameSet(a.SS, b.SS, (x, y) => x === y);
    case 'NS':
      return sameSet(a.NS, b.NS, (x, y) => compareNumbers(x, y) === 0);
    case 'BS':
      return sameSet(a.BS, b.BS, (x, y) => compareBinary(x, y) === 0);
    case 'L':
      return a.L.length === b.L.length && a.L.every((x, i) => valuesEqual(x, b.L[i]));
    case 'M': {
      const ka = Object.keys(a.M);
      return ka.length === Object.keys(b.M).length && ka.every((k) => k in b.M && valuesEqual(a.M[k], b.M[k]));
    }
    default:
      return false;
  }
}

/** A value as sent, checked as DynamoDB checks it, its numbers in canonical form. */
export function checkValue(value, where) {
  if (value === null || typeof value !== 'object' || Array.isArray(value)) {
    throw validation(`${where}: an AttributeValue must be an object`);
  }
  const keys = Object.keys(value);
  if (keys.length !== 1) {
    throw validation(
      keys.length === 0
        ? `${where}: Supplied AttributeValue is empty, must contain exactly one of the supported datatypes`
        : `${where}: Supplied AttributeValue has more than one datatypes set, must contain exactly one of the supported datatypes`,
    );
  }
  const [t] = keys;
  const v = value[t];
  if (!TYPES.has(t)) throw validation(`${where}: unknown AttributeValue type ${t}`);
  switch (t) {
    case 'S':
    case 'B':
      if (typeof v !== 'string') throw validation(`${where}: ${t} must be a string`);
      return value;
    case 'N':
      return { N: canonicalNumber(v) };
    case 'BOOL':
      if (typeof v !== 'boolean') throw validation(`${where}: BOOL must be true or false`);
      return value;
    case 'NULL':
      if (v !== true) throw validation(`${where}: Null attribute value types must have the value of true`);
      return value;
    case 'SS':
    case 'BS':
    case 'NS': {
      if (!Array.isArray(v) || v.length === 0) throw validation(`${where}: a set may not be empty`);
      const items = t === 'NS' ? v.map(canonicalNumber) : v;
      if (items.some((x) => typeof x !== 'string')) throw validation(`${where}: ${t} members must be strings`);
      const distinct = new Set(items);
      if (distinct.size !== items.length) throw validation(`${where}: Input collection ${JSON.stringify(v)} contains duplicates.`);
      return { [t]: items };
    }
    case 'L':
      if (!Array.isArray(v)) throw validation(`${where}: L must be a list`);
      return { L: v.map((x) => checkValue(x, where)) };
    case 'M': {
      if (v === null || typeof v !== 'object' || Array.isArray(v)) throw validation(`${where}: M must be a map`);
      const out = {};
      for (const [k, x] of Object.entries(v)) out[k] = checkValue(x, where);
      return { M: out };
    }
    default:
      throw validation(`${where}: unknown AttributeValue type ${t}`);
  }
}

export function checkItem(item, where) {
  if (item === null || typeof item !== 'object' || Array.isArray(item)) {
    throw validation(`${where}: an item must be a map of attributes`);
  }
  const out = {};
  for (const [name, value] of Object.entries(item)) {
    if (name.length === 0) throw validation(`${where}: an attribute name must not be empty`);
    out[name] = checkValue(value, `${where}.${name}`);
  }
  return out;
}

/** An item's size as DynamoDB counts it, near enough to enforce its 400 KB limit. */
export function itemSize(item) {
  let size = 0;
  for (const [name, value] of Object.entries(item)) size += Buffer.byteLength(name) + valueSize(value);
  return size;
}

function valueSize(value) {
  const t = typeOf(value);
  const v = value[t];
  switch (t) {
    case 'S':
      return Buffer.byteLength(v);
    case 'N':
      return Math.ceil(v.replace(/[-.]/g, '').length / 2) + 1;
    case 'B':
      return Buffer.from(v, 'base64').length;
    case 'BOOL':
    case 'NULL':
      return 1;
    case 'SS':
      return v.reduce((n, x) => n + Buffer.byteLength(x), 0);
    case 'NS':
      return v.reduce((n, x) => n + Math.ceil(x.replace(/[-.]/g, '').length / 2) + 1, 0);
    case 'BS':
      return v.reduce((n, x) => n + Buffer.from(x, 'base64').length, 0);
    case 'L':
      return 3 + v.reduce((n, x) => n + 1 + valueSize(x), 0);
    case 'M':
      return 3 + Object.entries(v).reduce((n, [k, x]) => n + 1 + Buffer.byteLength(k) + valueSize(x), 0);
    default:
      return 0;
  }
}
