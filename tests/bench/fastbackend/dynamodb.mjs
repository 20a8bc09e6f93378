// DynamoDB (JSON 1.0, X-Amz-Target DynamoDB_20120810.*): tables with a hash and range key and
// global secondary indexes, kept in memory. Every operation names the parameters it follows;
// a request carrying any other parameter (or a value of one it does not follow) is refused as
// Unsupported, so nothing is silently ignored. TTL is recorded, never applied (like moto: readers
// filter ``ttl``); streams are described, never recorded.

import { randomUUID } from 'node:crypto';
import {
  Scope,
  applyUpdate,
  bindCondition,
  bindProjection,
  bindUpdate,
  evaluate,
  parseCondition,
  parseProjection,
  parseUpdate,
  project,
} from './expressions.mjs';
import {
  DynamoError,
  Unsupported,
  checkItem,
  checkValue,
  compareValues,
  itemSize,
  typeOf,
  validation,
} from './values.mjs';

const ACCOUNT = '123456789012';
const ITEM_LIMIT = 400 * 1024;
const PAGE_LIMIT = 1024 * 1024;
const BATCH_GET_LIMIT = 100;
const TABLE_NAME = /^[a-zA-Z0-9_.-]{3,255}$/;
const COMMON = ['TableName', 'ReturnConsumedCapacity'];

function accepts(op, body, names) {
  for (const key of Object.keys(body)) {
    if (!names.includes(key) && !COMMON.includes(key)) throw new Unsupported(`DynamoDB ${op} parameter ${key}`);
  }
  const capacity = body.ReturnConsumedCapacity;
  if (capacity !== undefined && capacity !== 'NONE') throw new Unsupported(`DynamoDB ${op} ReturnConsumedCapacity=${capacity}`);
  const metrics = body.ReturnItemCollectionMetrics;
  if (metrics !== undefined && metrics !== 'NONE') throw new Unsupported(`DynamoDB ${op} ReturnItemCollectionMetrics=${metrics}`);
}

function required(body, name) {
  if (body[name] === undefined || body[name] === null) {
    const member = name[0].toLowerCase() + name.slice(1);
    throw validation(`1 validation error detected: Value null at '${member}' failed to satisfy constraint: Member must not be null`);
  }
  return body[name];
}

function keyString(value) {
  const t = typeOf(value);
  return `${t}:${value[t]}`;
}

function compareTuples(a, b) {
  for (let i = 0; i < a.length; i++) {
    const order = compareValues(a[i], b[i]);
    if (order) return order;
  }
  return 0;
}

function notFound(what) {
  return new DynamoError('ResourceNotFoundException', `Requested resource not found: ${what}`);
}

class Table {
  constructor(body, region) {
    const name = body.TableName;
    const definitions = new Map();
    for (const d of required(body, 'AttributeDefinitions')) {
      if (!['S', 'N', 'B'].includes(d.AttributeType)) throw validation(`Invalid AttributeType ${d.AttributeType} for ${d.AttributeName}`);
      definitions.set(d.AttributeName, d.AttributeType);
    }
    const schema = (keys, where) => {
      if (!Array.isArray(keys) || keys.length < 1 || keys.length > 2 || keys[0].KeyType !== 'HASH' || (keys[1] && keys[1].KeyType !== 'RANGE')) {
        throw validation(`${where}: a key schema is one HASH key, then at most one RANGE key`);
      }
      for (const k of keys) {
        if (!definitions.has(k.AttributeName)) {
          throw validation(`One or more parameter values were invalid: Some index key attributes are not defined in AttributeDefinitions. Keys: [${k.AttributeName}], AttributeDefinitions: [${[...definitions.keys()].join(', ')}]`);
        }
      }
      return keys.map((k) => k.AttributeName);
    };
    this.name = name;
    this.keyNames = schema(required(body, 'KeySchema'), 'KeySchema');
    this.definitions = definitions;
    this.indexes = new Map();
    const used = new Set(this.keyNames);
    for (const gsi of body.GlobalSecondaryIndexes || []) {
      const projection = gsi.Projection || {};
      if (!['KEYS_ONLY', 'ALL'].includes(projection.ProjectionType)) {
        throw new Unsupported(`DynamoDB CreateTable index projection ${projection.ProjectionType}`);
      }
      const keyNames = schema(gsi.KeySchema, `GlobalSecondaryIndexes ${gsi.IndexName}`);
      for (const k of keyNames) used.add(k);
      this.indexes.set(gsi.IndexName, { name: gsi.IndexName, keyNames, projection: projection.ProjectionType, spec: gsi });
    }
    if (used.size !== definitions.size) {
      throw validation('One or more parameter values were invalid: Number of attributes in KeySchema does not exactly match number of attributes defined in AttributeDefinitions');
    }
    const billing = body.BillingMode || 'PROVISIONED';
    this.arn = `arn:aws:dynamodb:${region}:${ACCOUNT}:table/${name}`;
    this.created = Date.now() / 1000;
    this.billing = billing;
    this.stream = body.StreamSpecification && body.StreamSpecification.StreamEnabled ? body.StreamSpecification : undefined;
    this.streamLabel = new Date().toISOString().replace('Z', '');
    this.spec = body;
    this.partitions = new Map();
    this.count = 0;
    this.ttl = undefined;
    this.pitr = false;
    this.tags = new Map((body.Tags || []).map((t) => [t.Key, t.Value]));
  }

  describe(status = 'ACTIVE') {
    const out = {
      TableName: this.name,
      TableArn: this.arn,
      TableId: this.arn.length.toString(16).padStart(8, '0') + '-0000-4000-8000-000000000000',
      TableStatus: status,
      CreationDateTime: this.created,
      KeySchema: this.spec.KeySchema,
      AttributeDefinitions: this.spec.AttributeDefinitions,
      ItemCount: this.count,
      TableSizeBytes: 0,
      BillingModeSummary: { BillingMode: this.billing },
      ProvisionedThroughput: {
        NumberOfDecreasesToday: 0,
        ReadCapacityUnits: (this.spec.ProvisionedThroughput || {}).ReadCapacityUnits || 0,
        WriteCapacityUnits: (this.spec.ProvisionedThroughput || {}).WriteCapacityUnits || 0,
      },
    };
    if (this.indexes.size) {
      out.GlobalSecondaryIndexes = [...this.indexes.values()].map((i) => ({
        IndexName: i.name,
        KeySchema: i.spec.KeySchema,
        Projection: i.spec.Projection,
        IndexStatus: 'ACTIVE',
        IndexArn: `${this.arn}/index/${i.name}`,
        ItemCount: 0,
        IndexSizeBytes: 0,
        ProvisionedThroughput: { NumberOfDecreasesToday: 0, ReadCapacityUnits: 0, WriteCapacityUnits: 0 },
      }));
    }
    if (this.stream) {
      out.StreamSpecification = this.stream;
      out.LatestStreamLabel = this.streamLabel;
      out.LatestStreamArn = `${this.arn}/stream/${this.streamLabel}`;
    }
    return out;
  }

  /** A Key parameter checked against the key schema: [hash string, range string]. */
  key(key, where = 'Key') {
    if (!key || typeof key !== 'object') throw validation(`${where}: the provided key element does not match the schema`);
    const names = Object.keys(key);
    if (names.length !== this.keyNames.length || !this.keyNames.every((n) => n in key)) {
      throw validation('The provided key element does not match the schema');
    }
    return this.keyNames.map((n) => this.keyPart(n, checkValue(key[n], `${where}.${n}`), 'The provided key element does not match the schema'));
  }

  keyPart(name, value, mismatch) {
    const want = this.definitions.get(name);
    if (typeOf(value) !== want) throw validation(mismatch);
    if ((want === 'S' || want === 'B') && value[want] === '') {
      throw validation(`One or more parameter values are not valid. The AttributeValue for a key attribute cannot contain an empty ${want === 'S' ? 'string' : 'binary'} value. Key: ${name}`);
    }
    return keyString(value);
  }

  /** A whole item checked as PutItem checks it (keys present and typed, index keys typed). */
  checkStored(item) {
    const parts = this.keyNames.map((n) => {
      if (!(n in item)) throw validation(`One or more parameter values were invalid: Missing the key ${n} in the item`);
      return this.keyPart(n, item[n], `One or more parameter values were invalid: Type mismatch for key ${n} expected: ${this.definitions.get(n)} actual: ${typeOf(item[n])}`);
    });
    for (const index of this.indexes.values()) {
      for (const n of index.keyNames) {
        if (n in item && !this.keyNames.includes(n)) {
          const want = this.definitions.get(n);
          if (typeOf(item[n]) !== want) {
            throw validation(`One or more parameter values were invalid: Type mismatch for Index Key ${n} Expected: ${want} Actual: ${typeOf(item[n])} IndexName: ${index.name}`);
          }
          if ((want === 'S' || want === 'B') && item[n][want] === '') {
            throw validation(`One or more parameter values are not valid. A value specified for a secondary index key is not supported. The AttributeValue for a key attribute cannot contain an empty ${want === 'S' ? 'string' : 'binary'} value. IndexName: ${index.name}, IndexKey: ${n}`);
          }
        }
      }
    }
    if (itemSize(item) > ITEM_LIMIT) throw validation('Item size has exceeded the maximum allowed size');
    return parts;
  }

  get([hash, range]) {
    const partition = this.partitions.get(hash);
    return partition && partition.items.get(range || '');
  }

  put([hash, range], item) {
    let partition = this.partitions.get(hash);
    if (!partition) {
      partition = { items: new Map(), sorted: null };
      this.partitions.set(hash, partition);
    }
    const r = range || '';
    if (!partition.items.has(r)) this.count += 1;
    partition.items.set(r, item);
    partition.sorted = null; // it holds the items themselves: a replaced one must not be read
  }

  remove([hash, range]) {
    const partition = this.partitions.get(hash);
    if (partition && partition.items.delete(range || '')) {
      partition.sorted = null;
      this.count -= 1;
      if (partition.items.size === 0) this.partitions.delete(hash);
    }
  }

  /** A partition's items in range key order. */
  sortedPartition(hash) {
    const partition = this.partitions.get(hash);
    if (!partition) return [];
    if (!partition.sorted) {
      const rangeName = this.keyNames[1];
      partition.sorted = [...partition.items.values()];
      if (rangeName) partition.sorted.sort((a, b) => compareValues(a[rangeName], b[rangeName]));
    }
    return partition.sorted;
  }

  *allItems() {
    for (const hash of this.partitions.keys()) yield* this.sortedPartition(hash);
  }
}

function conditionFailed(old, body) {
  const extra = body.ReturnValuesOnConditionCheckFailure === 'ALL_OLD' && old ? { Item: old } : undefined;
  return new DynamoError('ConditionalCheckFailedException', 'The conditional request failed', extra);
}

function checkReturnOnFailure(op, body) {
  const r = body.ReturnValuesOnConditionCheckFailure;
  if (r !== undefined && r !== 'NONE' && r !== 'ALL_OLD') {
    throw validation(`1 validation error detected: Value '${r}' at 'returnValuesOnConditionCheckFailure' failed to satisfy constraint: Member must satisfy enum value set: [ALL_OLD, NONE]`);
  }
}

export class DynamoDB {
  constructor() {
    this.tables = new Map();
  }

  table(name) {
    if (typeof name !== 'string' || !name) required({}, 'TableName');
    const table = this.tables.get(name);
    if (!table) throw notFound(`Table: ${name} not found`);
    return table;
  }

  tableByArn(arn) {
    for (const t of this.tables.values()) if (t.arn === arn) return t;
    throw notFound(`Table: ${arn} not found`);
  }

  /** Answer one operation: the response body, or a DynamoError / Unsupported thrown. */
  handle(op, body, region) {
    const handler = OPERATIONS[op];
    if (!handler) throw new Unsupported(`DynamoDB operation ${op}`);
    return handler.call(this, body, region);
  }
}

function scopeOf(body) {
  return new Scope(body.ExpressionAttributeNames, body.ExpressionAttributeValues);
}

function condition(body, scope, kind = 'ConditionExpression') {
  const text = body[kind];
  return text === undefined ? undefined : bindCondition(parseCondition(text, kind), scope, kind);
}

function projectionOf(body, scope) {
  return body.ProjectionExpression === undefined ? undefined : bindProjection(parseProjection(body.ProjectionExpression), scope);
}

const OPERATIONS = {
  CreateTable(body, region) {
    accepts('CreateTable', body, ['AttributeDefinitions', 'KeySchema', 'GlobalSecondaryIndexes', 'BillingMode', 'ProvisionedThroughput', 'StreamSpecification', 'Tags']);
    const name = required(body, 'TableName');
    if (!TABLE_NAME.test(name)) throw validation(`TableName must be 3-255 characters of [a-zA-Z0-9_.-]: ${name}`);
    if (this.tables.has(name)) throw new DynamoError('ResourceInUseException', `Table already exists: ${name}`);
    const table = new Table(body, region);
    this.tables.set(name, table);
    return { TableDescription: table.describe() };
  },

  DescribeTable(body) {
    accepts('DescribeTable', body, []);
    return { Table: this.table(body.TableName).describe() };
  },

  DeleteTable(body) {
    accepts('DeleteTable', body, []);
    const table = this.table(body.TableName);
    this.tables.delete(table.name);
    return { TableDescription: table.describe('DELETING') };
  },

  ListTables(body) {
    accepts('ListTables', body, ['ExclusiveStartTableName', 'Limit']);
    const names = [...this.tables.keys()].sort().filter((n) => !body.ExclusiveStartTableName || n > body.ExclusiveStartTableName);
    const limit = body.Limit || 100;
    const out = { TableNames: names.slice(0, limit) };
    if (names.length > limit) out.LastEvaluatedTableName = out.TableNames[limit - 1];
    return out;
  },

  DescribeTimeToLive(body) {
    accepts('DescribeTimeToLive', body, []);
    const { ttl } = this.table(body.TableName);
    return { TimeToLiveDescription: ttl ? { TimeToLiveStatus: 'ENABLED', AttributeName: ttl } : { TimeToLiveStatus: 'DISABLED' } };
  },

  UpdateTimeToLive(body) {
    accepts('UpdateTimeToLive', body, ['TimeToLiveSpecification']);
    const table = this.table(body.TableName);
    const spec = required(body, 'TimeToLiveSpecification');
    if (spec.Enabled && table.ttl) throw validation('TimeToLive is already enabled');
    if (!spec.Enabled && !table.ttl) throw validation('TimeToLive is already disabled');
    table.ttl = spec.Enabled ? spec.AttributeName : undefined;
    return { TimeToLiveSpecification: spec };
  },

  DescribeContinuousBackups(body) {
    accepts('DescribeContinuousBackups', body, []);
    return { ContinuousBackupsDescription: backups(this.table(body.TableName)) };
  },

  UpdateContinuousBackups(body) {
    accepts('UpdateContinuousBackups', body, ['PointInTimeRecoverySpecification']);
    const table = this.table(body.TableName);
    const spec = required(body, 'PointInTimeRecoverySpecification');
    if (spec.RecoveryPeriodInDays !== undefined) throw new Unsupported('DynamoDB UpdateContinuousBackups RecoveryPeriodInDays');
    table.pitr = Boolean(spec.PointInTimeRecoveryEnabled);
    return { ContinuousBackupsDescription: backups(table) };
  },

  ListTagsOfResource(body) {
    accepts('ListTagsOfResource', body, ['ResourceArn']);
    const table = this.tableByArn(required(body, 'ResourceArn'));
    return { Tags: [...table.tags].map(([Key, Value]) => ({ Key, Value })) };
  },

  TagResource(body) {
    accepts('TagResource', body, ['ResourceArn', 'Tags']);
    const table = this.tableByArn(required(body, 'ResourceArn'));
    for (const t of required(body, 'Tags')) table.tags.set(t.Key, t.Value);
    return {};
  },

  UntagResource(body) {
    accepts('UntagResource', body, ['ResourceArn', 'TagKeys']);
    const table = this.tableByArn(required(body, 'ResourceArn'));
    for (const k of required(body, 'TagKeys')) table.tags.delete(k);
    return {};
  },

  GetItem(body) {
    accepts('GetItem', body, ['Key', 'ConsistentRead', 'ProjectionExpression', 'ExpressionAttributeNames']);
    const table = this.table(body.TableName);
    const key = table.key(required(body, 'Key'));
    const scope = scopeOf(body);
    const names = projectionOf(body, scope);
    scope.finish();
    const item = table.get(key);
    if (!item) return {};
    return { Item: names ? project(item, names) : item };
  },

  PutItem(body) {
    accepts('PutItem', body, ['Item', 'ConditionExpression', 'ExpressionAttributeNames', 'ExpressionAttributeValues', 'ReturnValues', 'ReturnValuesOnConditionCheckFailure', 'ReturnItemCollectionMetrics']);
    const table = this.table(body.TableName);
    const item = checkItem(required(body, 'Item'), 'Item');
    const key = table.checkStored(item);
    const returns = body.ReturnValues || 'NONE';
    if (returns !== 'NONE' && returns !== 'ALL_OLD') throw validation('Return values set to invalid value');
    checkReturnOnFailure('PutItem', body);
    const scope = scopeOf(body);
    const cond = condition(body, scope);
    scope.finish();
    const old = table.get(key);
    if (cond && !evaluate(cond, old)) throw conditionFailed(old, body);
    table.put(key, item);
    return returns === 'ALL_OLD' && old ? { Attributes: old } : {};
  },

  UpdateItem(body) {
    accepts('UpdateItem', body, ['Key', 'UpdateExpression', 'ConditionExpression', 'ExpressionAttributeNames', 'ExpressionAttributeValues', 'ReturnValues', 'ReturnValuesOnConditionCheckFailure', 'ReturnItemCollectionMetrics']);
    const table = this.table(body.TableName);
    const rawKey = required(body, 'Key');
    const key = table.key(rawKey);
    const returns = body.ReturnValues || 'NONE';
    if (!['NONE', 'ALL_OLD', 'ALL_NEW', 'UPDATED_OLD', 'UPDATED_NEW'].includes(returns)) throw validation('Return values set to invalid value');
    checkReturnOnFailure('UpdateItem', body);
    const scope = scopeOf(body);
    const update = body.UpdateExpression === undefined
      ? { set: [], remove: [], add: [], touched: [] }
      : bindUpdate(parseUpdate(body.UpdateExpression), scope, table.keyNames);
    const cond = condition(body, scope);
    scope.finish();
    const old = table.get(key);
    if (cond && !evaluate(cond, old)) throw conditionFailed(old, body);
    const keyItem = {};
    for (const n of table.keyNames) keyItem[n] = checkValue(rawKey[n], `Key.${n}`);
    const next = applyUpdate(update, old, keyItem);
    table.checkStored(next);
    table.put(key, next);
    switch (returns) {
      case 'ALL_OLD':
        return old ? { Attributes: old } : {};
      case 'ALL_NEW':
        return { Attributes: next };
      case 'UPDATED_OLD': {
        const changed = project(old || {}, update.touched);
        return Object.keys(changed).length ? { Attributes: changed } : {};
      }
      case 'UPDATED_NEW': {
        const changed = project(next, update.touched);
        return Object.keys(changed).length ? { Attributes: changed } : {};
      }
      default:
        return {};
    }
  },

  DeleteItem(body) {
    accepts('DeleteItem', body, ['Key', 'ConditionExpression', 'ExpressionAttributeNames', 'ExpressionAttributeValues', 'ReturnValues', 'ReturnValuesOnConditionCheckFailure', 'ReturnItemCollectionMetrics']);
    const table = this.table(body.TableName);
    const key = table.key(required(body, 'Key'));
    const returns = body.ReturnValues || 'NONE';
    if (returns !== 'NONE' && returns !== 'ALL_OLD') throw validation('Return values set to invalid value');
    checkReturnOnFailure('DeleteItem', body);
    const scope = scopeOf(body);
    const cond = condition(body, scope);
    scope.finish();
    const old = table.get(key);
    if (cond && !evaluate(cond, old)) throw conditionFailed(old, body);
    table.remove(key);
    return returns === 'ALL_OLD' && old ? { Attributes: old } : {};
  },

  BatchGetItem(body) {
    accepts('BatchGetItem', body, ['RequestItems']);
    const requests = required(body, 'RequestItems');
    const total = Object.values(requests).reduce((n, r) => n + (r.Keys || []).length, 0);
    if (total > BATCH_GET_LIMIT) throw validation('Too many items requested for the BatchGetItem call');
    const responses = {};
    for (const [name, request] of Object.entries(requests)) {
      accepts('BatchGetItem', { ...request }, ['Keys', 'ConsistentRead', 'ProjectionExpression', 'ExpressionAttributeNames']);
      const table = this.table(name);
      const scope = new Scope(request.ExpressionAttributeNames, undefined);
      const names = projectionOf(request, scope);
      scope.finish();
      const seen = new Set();
      responses[name] = [];
      for (const k of request.Keys || []) {
        const key = table.key(k, 'Keys');
        const id = key.join('\u0000');
        if (seen.has(id)) throw validation('Provided list of item keys contains duplicates');
        seen.add(id);
        const item = table.get(key);
        if (item) responses[name].push(names ? project(item, names) : item);
      }
    }
    return { Responses: responses, UnprocessedKeys: {} };
  },

  Query(body) {
    accepts('Query', body, ['IndexName', 'KeyConditionExpression', 'FilterExpression', 'ProjectionExpression', 'ExpressionAttributeNames', 'ExpressionAttributeValues', 'ScanIndexForward', 'Limit', 'ExclusiveStartKey', 'ConsistentRead', 'Select']);
    const table = this.table(body.TableName);
    const index = body.IndexName === undefined ? undefined : table.indexes.get(body.IndexName);
    if (body.IndexName !== undefined && !index) throw validation(`The table does not have the specified index: ${body.IndexName}`);
    if (index && body.ConsistentRead) throw validation('Consistent reads are not supported on global secondary indexes');
    const [hashName, rangeName] = index ? index.keyNames : table.keyNames;
    const scope = scopeOf(body);
    const keyCond = condition({ KeyConditionExpression: required(body, 'KeyConditionExpression') }, scope, 'KeyConditionExpression');
    const { hash, range } = keyParts(keyCond, hashName, rangeName);
    const filter = condition(body, scope, 'FilterExpression');
    if (filter) {
      for (const name of pathsOf(filter)) {
        if (name === hashName || name === rangeName) {
          throw validation(`Filter Expression can only contain non-primary key attributes: Primary key attribute: ${name}`);
        }
      }
    }
    const names = projectionOf(body, scope);
    scope.finish();
    let candidates;
    let order;
    if (index) {
      candidates = [];
      for (const item of table.allItems()) {
        if (item[hashName] && compareValues(item[hashName], hash) === 0 && (!rangeName || item[rangeName])) candidates.push(item);
      }
      order = (item) => [...(rangeName ? [item[rangeName]] : []), ...table.keyNames.map((n) => item[n])];
      candidates.sort((a, b) => compareTuples(order(a), order(b)));
    } else {
      if (typeOf(hash) !== table.definitions.get(hashName)) throw validation('One or more parameter values were invalid: Condition parameter type does not match schema type');
      candidates = table.sortedPartition(keyString(hash));
      order = (item) => (rangeName ? [item[rangeName]] : []);
    }
    if (range) candidates = candidates.filter((item) => evaluate(range, item));
    const keyNames = index ? [...new Set([...table.keyNames, ...index.keyNames])] : table.keyNames;
    return page(body, table, candidates, order, keyNames, filter, names, index);
  },

  Scan(body) {
    accepts('Scan', body, ['FilterExpression', 'ProjectionExpression', 'ExpressionAttributeNames', 'ExpressionAttributeValues', 'Limit', 'ExclusiveStartKey', 'ConsistentRead', 'Select']);
    const table = this.table(body.TableName);
    const scope = scopeOf(body);
    const filter = condition(body, scope, 'FilterExpression');
    const names = projectionOf(body, scope);
    scope.finish();
    const candidates = [...table.allItems()];
    // the scan order: partitions as they were first written, each in range key order
    const position = new Map();
    let n = 0;
    for (const hash of table.partitions.keys()) position.set(hash, n++);
    const order = (item) => [{ N: String(position.get(keyString(item[table.keyNames[0]])) ?? -1) }, ...(table.keyNames[1] ? [item[table.keyNames[1]]] : [])];
    return page(body, table, candidates, order, table.keyNames, filter, names, undefined);
  },
};

function backups(table) {
  return {
    ContinuousBackupsStatus: 'ENABLED',
    PointInTimeRecoveryDescription: { PointInTimeRecoveryStatus: table.pitr ? 'ENABLED' : 'DISABLED' },
  };
}

function pathsOf(bound, out = []) {
  if (!bound || typeof bound !== 'object') return out;
  if (bound.t === 'path') out.push(bound.p[0]);
  for (const v of Object.values(bound)) {
    if (Array.isArray(v)) v.forEach((x) => pathsOf(x, out));
    else if (v && typeof v === 'object' && v.t) pathsOf(v, out);
  }
  return out;
}

/** The hash value and the range condition of a key condition, as DynamoDB allows them. */
function keyParts(bound, hashName, rangeName) {
  const conditions = bound.t === 'and' ? [bound.a, bound.b] : [bound];
  let hash;
  let range;
  const isKey = (o, name) => o && o.t === 'path' && o.p.length === 1 && o.p[0] === name;
  for (const c of conditions) {
    if (c.t === 'cmp' && c.op === '=' && isKey(c.l, hashName) && c.r.t === 'val' && hash === undefined) {
      hash = c.r.v;
    } else if (rangeName && range === undefined && ((c.t === 'cmp' && isKey(c.l, rangeName) && c.r.t === 'val') || (c.t === 'between' && isKey(c.v, rangeName) && c.lo.t === 'val' && c.hi.t === 'val') || (c.t === 'fn' && c.name === 'begins_with' && isKey(c.args[0], rangeName) && c.args[1].t === 'val'))) {
      range = c;
    } else {
      throw validation(`Query key condition not supported (or missed key schema element: ${hashName})`);
    }
  }
  if (hash === undefined) throw validation(`Query condition missed key schema element: ${hashName}`);
  return { hash, range };
}

function page(body, table, candidates, order, keyNames, filter, names, index) {
  let list = body.ScanIndexForward === false ? [...candidates].reverse() : candidates;
  const forward = body.ScanIndexForward !== false;
  if (body.ExclusiveStartKey) {
    const start = checkItem(body.ExclusiveStartKey, 'ExclusiveStartKey');
    for (const n of keyNames) if (!(n in start)) throw validation('The provided starting key is invalid: The provided key element does not match the schema');
    const after = order(start);
    list = list.filter((item) => {
      const c = compareTuples(order(item), after);
      return forward ? c > 0 : c < 0;
    });
  }
  const select = body.Select || (names ? 'SPECIFIC_ATTRIBUTES' : index && index.projection === 'KEYS_ONLY' ? 'ALL_PROJECTED_ATTRIBUTES' : 'ALL_ATTRIBUTES');
  if (!['ALL_ATTRIBUTES', 'ALL_PROJECTED_ATTRIBUTES', 'SPECIFIC_ATTRIBUTES', 'COUNT'].includes(select)) throw validation(`Invalid Select ${select}`);
  if (select === 'ALL_ATTRIBUTES' && index && index.projection === 'KEYS_ONLY') {
    throw validation('One or more parameter values were invalid: Select type ALL_ATTRIBUTES is not supported for global secondary index fleet because its projection type is not ALL'.replace('fleet', index.name));
  }
  if (select === 'SPECIFIC_ATTRIBUTES' && !names) throw validation('SPECIFIC_ATTRIBUTES requires a ProjectionExpression');
  if (select !== 'SPECIFIC_ATTRIBUTES' && names) throw validation('Cannot specify the ProjectionExpression when choosing to get ALL_ATTRIBUTES or COUNT');
  const limit = body.Limit === undefined ? Infinity : body.Limit;
  if (limit < 1) throw validation('Limit must be greater than or equal to 1');
  const items = [];
  let scanned = 0;
  let bytes = 0;
  let last;
  for (const stored of list) {
    if (scanned >= limit || bytes > PAGE_LIMIT) {
      last = list[scanned - 1];
      break;
    }
    scanned += 1;
    bytes += itemSize(stored);
    const item = index && index.projection === 'KEYS_ONLY' ? project(stored, keyNames) : stored;
    if (filter && !evaluate(filter, item)) continue;
    items.push(names ? project(item, names) : item);
  }
  const out = { Count: items.length, ScannedCount: scanned };
  if (select !== 'COUNT') out.Items = items;
  if (last) out.LastEvaluatedKey = project(last, keyNames);
  return out;
}

export function requestId() {
  return randomUUID();
}
