// A small JSON Schema checker for tool arguments: the keywords tool schemas use, read as the
// server's gateway reads them (src/keel/tools/schema.cc), so that arguments it passes here are
// not refused when the run resumes. No code is generated or evaluated (the page's CSP has no
// 'unsafe-eval'). Keywords:
//   type (object, string, number, integer, boolean, array, null, or an array of them),
//   properties, required, additionalProperties (false or a schema), items, enum,
//   minimum, maximum, minLength, maxLength (in UTF-8 bytes, as the server counts), minItems,
//   maxItems.
// Other keywords are ignored. Unlike the server, which stops at the first problem, every
// problem is reported, each with the JSON path of the value it is about ($ is the whole).

export interface SchemaError {
  path: string;
  message: string;
}

const MAX_DEPTH = 32;
const MAX_ERRORS = 50;

type Obj = Record<string, unknown>;

function isObj(v: unknown): v is Obj {
  return v !== null && typeof v === 'object' && !Array.isArray(v);
}

export function typeOf(v: unknown): string {
  if (v === null) return 'null';
  if (Array.isArray(v)) return 'array';
  if (typeof v === 'number') return Number.isInteger(v) ? 'integer' : 'number';
  return typeof v;  // string, boolean, object
}

function isType(v: unknown, type: string): boolean {
  switch (type) {
    case 'number':
      return typeof v === 'number';
    case 'integer':
      return typeof v === 'number' && Number.isInteger(v);
    case 'object':
      return isObj(v);
    case 'array':
      return Array.isArray(v);
    case 'null':
      return v === null;
    case 'string':
    case 'boolean':
      return typeof v === type;
    default:
      return false;
  }
}

// $.a.b, $.list[0], $["a key"].
export function childPath(path: string, key: string|number): string {
  if (typeof key === 'number') return path + '[' + key + ']';
  return /^[A-Za-z_$][A-Za-z0-9_$]*$/.test(key) ? path + '.' + key :
                                                  path + '[' + JSON.stringify(key) + ']';
}

// Structural equality of JSON values, for enum.
function equal(a: unknown, b: unknown): boolean {
  if (a === b) return true;
  if (Array.isArray(a))
    return Array.isArray(b) && a.length === b.length && a.every((x, i) => equal(x, b[i]));
  if (isObj(a) && isObj(b)) {
    const ka = Object.keys(a);
    return ka.length === Object.keys(b).length && ka.every((k) => k in b && equal(a[k], b[k]));
  }
  return false;
}

function count(schema: Obj, keyword: string): number|null {
  const m = schema[keyword];
  return typeof m === 'number' && Number.isInteger(m) && m >= 0 ? m : null;
}

function num(schema: Obj, keyword: string): number|null {
  const m = schema[keyword];
  return typeof m === 'number' && Number.isFinite(m) ? m : null;
}

const encoder = new TextEncoder();

function bytes(s: string): number {
  return encoder.encode(s).length;
}

function short(v: unknown): string {
  const s = JSON.stringify(v) ?? String(v);
  return s.length > 80 ? s.slice(0, 77) + '...' : s;
}

function check(schema: unknown, v: unknown, path: string, depth: number, out: SchemaError[]): void {
  if (out.length >= MAX_ERRORS) return;
  if (depth > MAX_DEPTH) {
    out.push({path, message: 'nested too deeply'});
    return;
  }
  if (!isObj(schema)) return;
  const t = schema.type;
  if (typeof t === 'string' || Array.isArray(t)) {
    const wanted = (Array.isArray(t) ? t : [t]).filter((x): x is string => typeof x === 'string');
    if (!wanted.some((w) => isType(v, w))) {
      out.push({path, message: `expected ${wanted.join(' or ')}, got ${typeOf(v)}`});
      return;  // the other keywords would only repeat the mismatch
    }
  }
  if (Array.isArray(schema.enum) && !schema.enum.some((option) => equal(option, v))) {
    out.push({path, message: 'must be one of ' + schema.enum.map(short).join(', ')});
  }
  if (typeof v === 'number') {
    const min = num(schema, 'minimum');
    const max = num(schema, 'maximum');
    if (min !== null && v < min) out.push({path, message: `must be at least ${min}`});
    if (max !== null && v > max) out.push({path, message: `must be at most ${max}`});
  }
  if (typeof v === 'string') {
    const n = bytes(v);
    const min = count(schema, 'minLength');
    const max = count(schema, 'maxLength');
    const unit = n === v.length ? 'characters' : `bytes of UTF-8 (it has ${n})`;
    if (min !== null && n < min)
      out.push({path, message: min === 1 ? 'must not be empty' : `shorter than ${min} ${unit}`});
    if (max !== null && n > max) out.push({path, message: `longer than ${max} ${unit}`});
  }
  if (Array.isArray(v)) {
    const min = count(schema, 'minItems');
    const max = count(schema, 'maxItems');
    if (min !== null && v.length < min) out.push({path, message: `fewer than ${min} items`});
    if (max !== null && v.length > max) out.push({path, message: `more than ${max} items`});
    if (isObj(schema.items))
      v.forEach((item, i) => check(schema.items, item, childPath(path, i), depth + 1, out));
  }
  if (isObj(v)) {
    const props = isObj(schema.properties) ? schema.properties : null;
    if (Array.isArray(schema.required)) {
      for (const name of schema.required) {
        if (typeof name === 'string' && !Object.prototype.hasOwnProperty.call(v, name)) {
          out.push({path: childPath(path, name), message: 'required, missing'});
        }
      }
    }
    const extra = schema.additionalProperties;
    for (const [key, value] of Object.entries(v)) {
      const p = childPath(path, key);
      if (props && Object.prototype.hasOwnProperty.call(props, key))
        check(props[key], value, p, depth + 1, out);
      else if (extra === false)
        out.push({path: p, message: 'unknown field (the tool takes no such argument)'});
      else if (isObj(extra))
        check(extra, value, p, depth + 1, out);
    }
  }
}

// Every problem of `value` against `schema` (an empty list when it validates).
export function validate(schema: unknown, value: unknown): SchemaError[] {
  const out: SchemaError[] = [];
  check(schema, value, '$', 0, out);
  return out;
}
