// DynamoDB expressions: condition, filter and key condition expressions, update expressions and
// projections, parsed (and cached by their text), bound to a request's ExpressionAttributeNames
// and ExpressionAttributeValues, and evaluated against an item.
//
// Followed: comparisons = < <= > >=, BETWEEN, IN, AND, OR, NOT, parentheses, attribute_exists,
// attribute_not_exists, begins_with; SET (a value, a path, if_not_exists, + and -), REMOVE, ADD
// (numbers and sets), on top-level attributes. Anything else that DynamoDB accepts (<>, size,
// contains, attribute_type, list_append, DELETE, nested update paths) is refused as Unsupported,
// never guessed at. Errors DynamoDB would answer (syntax, reserved words, undefined or unused
// placeholders, bad operand types, key attributes updated) are its ValidationExceptions.

import { readFileSync } from 'node:fs';
import {
  Unsupported,
  addNumbers,
  checkValue,
  compareBinary,
  compareValues,
  typeOf,
  validation,
  valuesEqual,
} from './values.mjs';

const RESERVED = new Set(
  readFileSync(new URL('./reserved-words.txt', import.meta.url), 'utf8').split(/\s+/).filter(Boolean),
);
const TOKEN = /\s*(?:(#[A-Za-z0-9_]+)|(:[A-Za-z0-9_]+)|([A-Za-z_][A-Za-z0-9_]*)|(\d+)|(<>|<=|>=|[=<>(),.[\]+-]))/y;
const COMPARATORS = new Set(['=', '<>', '<', '<=', '>', '>=']);
const ORDERING = new Set(['<', '<=', '>', '>=']);

function tokenize(text, kind) {
  const tokens = [];
  TOKEN.lastIndex = 0;
  let at = 0;
  while (at < text.length) {
    if (/^\s*$/.test(text.slice(at))) break;
    TOKEN.lastIndex = at;
    const m = TOKEN.exec(text);
    if (!m) {
      const rest = text.slice(at).trim();
      throw validation(`Invalid ${kind}: Syntax error; token: "${rest[0]}", near: "${rest.slice(0, 12)}"`);
    }
    at = TOKEN.lastIndex;
    if (m[1]) tokens.push({ type: 'name', v: m[1] });
    else if (m[2]) tokens.push({ type: 'value', v: m[2] });
    else if (m[3]) tokens.push({ type: 'ident', v: m[3] });
    else if (m[4]) tokens.push({ type: 'number', v: m[4] });
    else tokens.push({ type: 'op', v: m[5] });
  }
  return tokens;
}

class Parser {
  constructor(text, kind) {
    this.text = text;
    this.kind = kind;
    this.tokens = tokenize(text, kind);
    this.i = 0;
  }

  peek(offset = 0) {
    return this.tokens[this.i + offset];
  }

  next() {
    return this.tokens[this.i++];
  }

  isOp(v, offset = 0) {
    const t = this.peek(offset);
    return t !== undefined && t.type === 'op' && t.v === v;
  }

  isWord(word, offset = 0) {
    const t = this.peek(offset);
    return t !== undefined && t.type === 'ident' && t.v.toUpperCase() === word;
  }

  expectOp(v) {
    if (!this.isOp(v)) this.syntax();
    return this.next();
  }

  syntax() {
    const t = this.peek();
    const near = this.tokens.slice(Math.max(0, this.i - 1), this.i + 2).map((x) => x.v).join(' ');
    throw validation(`Invalid ${this.kind}: Syntax error; token: "${t ? t.v : '<EOF>'}", near: "${near}"`);
  }

  end() {
    if (this.i < this.tokens.length) this.syntax();
  }

  // -- conditions ------------------------------------------------------------------------------

  or() {
    let left = this.and();
    while (this.isWord('OR')) {
      this.next();
      left = { t: 'or', a: left, b: this.and() };
    }
    return left;
  }

  and() {
    let left = this.not();
    while (this.isWord('AND')) {
      this.next();
      left = { t: 'and', a: left, b: this.not() };
    }
    return left;
  }

  not() {
    if (this.isWord('NOT')) {
      this.next();
      return { t: 'not', a: this.not() };
    }
    return this.primary();
  }

  primary() {
    if (this.isOp('(')) {
      this.next();
      const inner = this.or();
      this.expectOp(')');
      return inner;
    }
    const first = this.peek();
    if (first && first.type === 'ident' && this.isOp('(', 1)) {
      const name = first.v;
      if (name === 'attribute_exists' || name === 'attribute_not_exists') {
        this.next();
        this.next();
        const path = this.path();
        this.expectOp(')');
        return { t: 'fn', name, args: [path] };
      }
      if (name === 'begins_with') {
        this.next();
        this.next();
        const path = this.path();
        this.expectOp(',');
        const prefix = this.operand();
        this.expectOp(')');
        return { t: 'fn', name, args: [path, prefix] };
      }
      if (name === 'contains' || name === 'attribute_type' || name === 'size') {
        throw new Unsupported(`${this.kind} function ${name}() in "${this.text}"`);
      }
      throw validation(`Invalid ${this.kind}: Invalid function name; function: ${name}`);
    }
    const left = this.operand();
    const t = this.peek();
    if (t && t.type === 'op' && COMPARATORS.has(t.v)) {
      this.next();
      if (t.v === '<>') throw new Unsupported(`${this.kind} comparator <> in "${this.text}"`);
      return { t: 'cmp', op: t.v, l: left, r: this.operand() };
    }
    if (this.isWord('BETWEEN')) {
      this.next();
      const lo = this.operand();
      if (!this.isWord('AND')) this.syntax();
      this.next();
      return { t: 'between', v: left, lo, hi: this.operand() };
    }
    if (this.isWord('IN')) {
      this.next();
      this.expectOp('(');
      const list = [this.operand()];
      while (this.isOp(',')) {
        this.next();
        list.push(this.operand());
      }
      this.expectOp(')');
      return { t: 'in', v: left, list };
    }
    return this.syntax();
  }

  operand() {
    const t = this.peek();
    if (t && t.type === 'value') {
      this.next();
      return { t: 'val', name: t.v };
    }
    if (t && t.type === 'ident' && this.isOp('(', 1)) {
      throw new Unsupported(`${this.kind} function ${t.v}() in "${this.text}"`);
    }
    return this.path();
  }

  path() {
    const elements = [this.element()];
    for (;;) {
      if (this.isOp('.')) {
        this.next();
        elements.push(this.element());
      } else if (this.isOp('[')) {
        this.next();
        const n = this.next();
        if (!n || n.type !== 'number') this.syntax();
        this.expectOp(']');
        elements.push({ index: Number.parseInt(n.v, 10) });
      } else {
        return { t: 'path', elements };
      }
    }
  }

  element() {
    const t = this.next();
    if (t && t.type === 'name') return { placeholder: t.v };
    if (t && t.type === 'ident') {
      if (RESERVED.has(t.v.toUpperCase())) {
        throw validation(`Invalid ${this.kind}: Attribute name is a reserved keyword; reserved keyword: ${t.v}`);
      }
      return { name: t.v };
    }
    this.i -= t ? 1 : 0;
    return this.syntax();
  }

  // -- updates and projections ---------------------------------------------------------------

  update() {
    const out = { set: [], remove: [], add: [] };
    const seen = new Set();
    if (this.tokens.length === 0) this.syntax();
    while (this.i < this.tokens.length) {
      const word = this.next();
      const clause = word && word.type === 'ident' ? word.v.toUpperCase() : '';
      if (!['SET', 'REMOVE', 'ADD', 'DELETE'].includes(clause)) {
        this.i -= 1;
        this.syntax();
      }
      if (seen.has(clause)) {
        throw validation(`Invalid UpdateExpression: The "${clause}" section can only be used once in an update expression;`);
      }
      seen.add(clause);
      if (clause === 'DELETE') throw new Unsupported(`UpdateExpression DELETE in "${this.text}"`);
      for (;;) {
        const path = this.path();
        if (clause === 'SET') {
          this.expectOp('=');
          out.set.push({ path, value: this.setValue() });
        } else if (clause === 'REMOVE') {
          out.remove.push(path);
        } else {
          const t = this.peek();
          if (!t || t.type !== 'value') this.syntax();
          this.next();
          out.add.push({ path, value: { t: 'val', name: t.v } });
        }
        if (!this.isOp(',')) break;
        this.next();
      }
    }
    return out;
  }

  setValue() {
    const a = this.setOperand();
    if (this.isOp('+') || this.isOp('-')) {
      const op = this.next().v;
      return { t: 'arith', op, a, b: this.setOperand() };
    }
    return a;
  }

  setOperand() {
    const t = this.peek();
    if (t && t.type === 'ident' && t.v === 'if_not_exists' && this.isOp('(', 1)) {
      this.next();
      this.next();
      const path = this.path();
      this.expectOp(',');
      const fallback = this.setOperand();
      this.expectOp(')');
      return { t: 'ifne', path, v: fallback };
    }
    return this.operand();
  }

  projection() {
    const paths = [this.path()];
    while (this.isOp(',')) {
      this.next();
      paths.push(this.path());
    }
    return paths;
  }
}

const cache = new Map();

function parsed(kind, text, how) {
  const key = `${kind}\u0000${text}`;
  let found = cache.get(key);
  if (found === undefined) {
    if (typeof text !== 'string' || text.trim() === '') throw validation(`Invalid ${kind}: The expression can not be empty;`);
    const parser = new Parser(text, kind);
    found = how(parser);
    parser.end();
    if (cache.size > 10_000) cache.clear();
    cache.set(key, found);
  }
  return found;
}

export const parseCondition = (text, kind = 'ConditionExpression') => parsed(kind, text, (p) => p.or());
export const parseUpdate = (text) => parsed('UpdateExpression', text, (p) => p.update());
export const parseProjection = (text) => parsed('ProjectionExpression', text, (p) => p.projection());

/** A request's ExpressionAttributeNames and Values, and which of them its expressions used. */
export class Scope {
  constructor(names, values) {
    if (names !== undefined && Object.keys(names).length === 0) throw validation('ExpressionAttributeNames must not be empty');
    if (values !== undefined && Object.keys(values).length === 0) throw validation('ExpressionAttributeValues must not be empty');
    this.names = names || {};
    this.values = {};
    for (const [k, v] of Object.entries(values || {})) this.values[k] = checkValue(v, `ExpressionAttributeValues.${k}`);
    this.usedNames = new Set();
    this.usedValues = new Set();
  }

  name(placeholder, kind) {
    if (!Object.hasOwn(this.names, placeholder)) {
      throw validation(`Invalid ${kind}: An expression attribute name used in the document path is not defined; attribute name: ${placeholder}`);
    }
    this.usedNames.add(placeholder);
    return this.names[placeholder];
  }

  value(placeholder, kind) {
    if (!Object.hasOwn(this.values, placeholder)) {
      throw validation(`Invalid ${kind}: An expression attribute value used in expression is not defined; attribute value: ${placeholder}`);
    }
    this.usedValues.add(placeholder);
    return this.values[placeholder];
  }

  /** DynamoDB refuses a request whose names or values are not all used by its expressions. */
  finish() {
    const names = Object.keys(this.names).filter((k) => !this.usedNames.has(k));
    if (names.length) throw validation(`Value provided in ExpressionAttributeNames unused in expressions: keys: {${names.join(', ')}}`);
    const values = Object.keys(this.values).filter((k) => !this.usedValues.has(k));
    if (values.length) throw validation(`Value provided in ExpressionAttributeValues unused in expressions: keys: {${values.join(', ')}}`);
  }
}

// -- binding: placeholders resolved (and checked) before any item is looked at -----------------

function bindPath(path, scope, kind) {
  return path.elements.map((e) => (e.placeholder ? scope.name(e.placeholder, kind) : e.name !== undefined ? e.name : e.index));
}

function bindOperand(op, scope, kind) {
  if (op.t === 'val') return { t: 'val', v: scope.value(op.name, kind) };
  if (op.t === 'path') return { t: 'path', p: bindPath(op, scope, kind) };
  if (op.t === 'ifne') return { t: 'ifne', p: bindPath(op.path, scope, kind), v: bindOperand(op.v, scope, kind) };
  if (op.t === 'arith') return { t: 'arith', op: op.op, a: bindOperand(op.a, scope, kind), b: bindOperand(op.b, scope, kind) };
  throw new Unsupported(`${kind} operand ${op.t}`);
}

function checkOrderable(op, operand, kind) {
  if (operand.t === 'val' && !['S', 'N', 'B'].includes(typeOf(operand.v))) {
    throw validation(`Invalid ${kind}: Incorrect operand type for operator or function; operator or function: ${op}, operand type: ${typeOf(operand.v)}`);
  }
}

export function bindCondition(ast, scope, kind = 'ConditionExpression') {
  switch (ast.t) {
    case 'or':
    case 'and':
      return { t: ast.t, a: bindCondition(ast.a, scope, kind), b: bindCondition(ast.b, scope, kind) };
    case 'not':
      return { t: 'not', a: bindCondition(ast.a, scope, kind) };
    case 'cmp': {
      const out = { t: 'cmp', op: ast.op, l: bindOperand(ast.l, scope, kind), r: bindOperand(ast.r, scope, kind) };
      if (ORDERING.has(ast.op)) {
        checkOrderable(ast.op, out.l, kind);
        checkOrderable(ast.op, out.r, kind);
      }
      return out;
    }
    case 'between': {
      const out = { t: 'between', v: bindOperand(ast.v, scope, kind), lo: bindOperand(ast.lo, scope, kind), hi: bindOperand(ast.hi, scope, kind) };
      for (const o of [out.v, out.lo, out.hi]) checkOrderable('BETWEEN', o, kind);
      if (out.lo.t === 'val' && out.hi.t === 'val') {
        const order = compareValues(out.lo.v, out.hi.v);
        if (order === undefined || order > 0) {
          throw validation(`Invalid ${kind}: The BETWEEN operator requires upper bound to be greater than or equal to lower bound; lower bound operand: AttributeValue: ${JSON.stringify(out.lo.v)}, upper bound operand: AttributeValue: ${JSON.stringify(out.hi.v)}`);
        }
      }
      return out;
    }
    case 'in':
      return { t: 'in', v: bindOperand(ast.v, scope, kind), list: ast.list.map((o) => bindOperand(o, scope, kind)) };
    case 'fn': {
      const args = ast.args.map((o) => bindOperand(o, scope, kind));
      if (ast.name === 'begins_with' && args[1].t === 'val' && !['S', 'B'].includes(typeOf(args[1].v))) {
        throw validation(`Invalid ${kind}: Incorrect operand type for operator or function; operator or function: begins_with, operand type: ${typeOf(args[1].v)}`);
      }
      return { t: 'fn', name: ast.name, args };
    }
    default:
      throw new Unsupported(`${kind} node ${ast.t}`);
  }
}

// -- evaluation --------------------------------------------------------------------------------

export function resolve(item, path) {
  if (item === undefined) return undefined;
  let value = Object.hasOwn(item, path[0]) ? item[path[0]] : undefined;
  for (let i = 1; i < path.length && value !== undefined; i++) {
    const el = path[i];
    if (typeof el === 'number') value = value.L !== undefined && el < value.L.length ? value.L[el] : undefined;
    else value = value.M !== undefined && Object.hasOwn(value.M, el) ? value.M[el] : undefined;
  }
  return value;
}

function operandValue(op, item) {
  return op.t === 'val' ? op.v : resolve(item, op.p);
}

export function evaluate(bound, item) {
  switch (bound.t) {
    case 'or':
      return evaluate(bound.a, item) || evaluate(bound.b, item);
    case 'and':
      return evaluate(bound.a, item) && evaluate(bound.b, item);
    case 'not':
      return !evaluate(bound.a, item);
    case 'cmp': {
      const l = operandValue(bound.l, item);
      const r = operandValue(bound.r, item);
      if (l === undefined || r === undefined) return false; // a missing attribute compares false
      if (bound.op === '=') return valuesEqual(l, r);
      const order = compareValues(l, r);
      if (order === undefined) return false; // different types are not ordered
      if (bound.op === '<') return order < 0;
      if (bound.op === '<=') return order <= 0;
      if (bound.op === '>') return order > 0;
      return order >= 0;
    }
    case 'between': {
      const v = operandValue(bound.v, item);
      const lo = operandValue(bound.lo, item);
      const hi = operandValue(bound.hi, item);
      if (v === undefined || lo === undefined || hi === undefined) return false;
      const a = compareValues(lo, v);
      const b = compareValues(v, hi);
      return a !== undefined && b !== undefined && a <= 0 && b <= 0;
    }
    case 'in': {
      const v = operandValue(bound.v, item);
      return v !== undefined && bound.list.some((o) => {
        const x = operandValue(o, item);
        return x !== undefined && valuesEqual(v, x);
      });
    }
    case 'fn': {
      const v = operandValue(bound.args[0], item);
      if (bound.name === 'attribute_exists') return v !== undefined;
      if (bound.name === 'attribute_not_exists') return v === undefined;
      const prefix = operandValue(bound.args[1], item);
      if (v === undefined || prefix === undefined || typeOf(v) !== typeOf(prefix)) return false;
      if (typeOf(v) === 'S') return v.S.startsWith(prefix.S);
      if (typeOf(v) === 'B') {
        const body = Buffer.from(v.B, 'base64');
        const head = Buffer.from(prefix.B, 'base64');
        return head.length <= body.length && compareBinary(body.subarray(0, head.length).toString('base64'), prefix.B) === 0;
      }
      return false;
    }
    default:
      throw new Unsupported(`condition node ${bound.t}`);
  }
}

// -- updates -----------------------------------------------------------------------------------

export function bindUpdate(ast, scope, keyNames) {
  const kind = 'UpdateExpression';
  const bound = {
    set: ast.set.map((a) => ({ p: bindPath(a.path, scope, kind), v: bindOperand(a.value, scope, kind) })),
    remove: ast.remove.map((p) => bindPath(p, scope, kind)),
    add: ast.add.map((a) => ({ p: bindPath(a.path, scope, kind), v: scope.value(a.value.name, kind) })),
  };
  const touched = [...bound.set.map((a) => a.p), ...bound.remove, ...bound.add.map((a) => a.p)];
  const seen = new Set();
  for (const path of touched) {
    if (path.length > 1) throw new Unsupported(`UpdateExpression on a nested document path (${path.join('.')})`);
    const [name] = path;
    if (keyNames.includes(name)) {
      throw validation(`One or more parameter values were invalid: Cannot update attribute ${name}. This attribute is part of the key`);
    }
    if (seen.has(name)) {
      throw validation(`Invalid UpdateExpression: Two document paths overlap with each other; must remove or rewrite one of these paths; path one: [${name}], path two: [${name}]`);
    }
    seen.add(name);
  }
  for (const { v } of bound.add) {
    if (!['N', 'SS', 'NS', 'BS'].includes(typeOf(v))) {
      throw validation(`Invalid UpdateExpression: Incorrect operand type for operator or function; operator: ADD, operand type: ${typeOf(v)}`);
    }
  }
  bound.touched = [...seen];
  return bound;
}

function setValue(op, old) {
  if (op.t === 'val') return op.v;
  if (op.t === 'path') {
    const v = resolve(old, op.p);
    if (v === undefined) throw validation('The provided expression refers to an attribute that does not exist in the item');
    return v;
  }
  if (op.t === 'ifne') {
    const v = resolve(old, op.p);
    return v !== undefined ? v : setValue(op.v, old);
  }
  const a = setValue(op.a, old);
  const b = setValue(op.b, old);
  if (typeOf(a) !== 'N' || typeOf(b) !== 'N') throw validation('An operand in the update expression has an incorrect data type');
  return { N: addNumbers(a.N, b.N, op.op === '-') };
}

/** The item after ``bound`` is applied to ``old`` (undefined: none yet; ``key`` makes it). */
export function applyUpdate(bound, old, key) {
  const next = { ...(old || key) };
  // every operand is read from the item as it was before this update
  const values = bound.set.map((a) => setValue(a.v, old));
  bound.set.forEach((a, i) => {
    next[a.p[0]] = values[i];
  });
  for (const p of bound.remove) delete next[p[0]];
  for (const { p, v } of bound.add) {
    const current = next[p[0]];
    const t = typeOf(v);
    if (current === undefined) {
      next[p[0]] = v;
    } else if (typeOf(current) !== t) {
      throw validation('An operand in the update expression has an incorrect data type');
    } else if (t === 'N') {
      next[p[0]] = { N: addNumbers(current.N, v.N) };
    } else {
      const member = t.slice(0, 1); // SS -> S, NS -> N, BS -> B
      const members = [...current[t]];
      for (const m of v[t]) {
        if (!members.some((x) => valuesEqual({ [member]: x }, { [member]: m }))) members.push(m);
      }
      next[p[0]] = { [t]: members };
    }
  }
  return next;
}

export function bindProjection(ast, scope) {
  return ast.map((path) => {
    const p = bindPath(path, scope, 'ProjectionExpression');
    if (p.length > 1) throw new Unsupported(`ProjectionExpression with a nested document path (${p.join('.')})`);
    return p[0];
  });
}

export function project(item, names) {
  const out = {};
  for (const n of names) if (Object.hasOwn(item, n)) out[n] = item[n];
  return out;
}
