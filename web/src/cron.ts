// Checks a cron expression and a time zone name in the page, with the server's rules and words
// (src/keel/schedule/cron.cc), so that the schedule form asks /v1/cron/preview only for what
// can parse: a refused request would show as an error in the browser's console while the
// expression is still being typed. The server stays the judge of what it accepts; this returns
// null for everything it would take (and for some it would not, which it then says).

interface Field {
  name: string;
  min: number;
  max: number;
  names?: string[];  // names[i] is the value min + i
}

const MONTHS = ['JAN', 'FEB', 'MAR', 'APR', 'MAY', 'JUN', 'JUL', 'AUG', 'SEP', 'OCT', 'NOV', 'DEC'];
const WEEKDAYS = ['SUN', 'MON', 'TUE', 'WED', 'THU', 'FRI', 'SAT'];
const FIELDS: Field[] = [
  {name: 'minute', min: 0, max: 59},
  {name: 'hour', min: 0, max: 23},
  {name: 'day-of-month', min: 1, max: 31},
  {name: 'month', min: 1, max: 12, names: MONTHS},
  {name: 'day-of-week', min: 0, max: 7, names: WEEKDAYS},
];
const MACROS: Record<string, string> = {
  '@yearly': '0 0 1 1 *',
  '@annually': '0 0 1 1 *',
  '@monthly': '0 0 1 * *',
  '@weekly': '0 0 * * 0',
  '@daily': '0 0 * * *',
  '@midnight': '0 0 * * *',
  '@hourly': '0 * * * *',
};
const MAX_EXPRESSION_BYTES = 200;
const DAYS_IN_MONTH = [0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];

const encoder = new TextEncoder();

// As the server prints a value in a message: control and non-ASCII characters as '?', at most
// 40 of them.
function shown(s: string): string {
  let out = '';
  for (const b of encoder.encode(s).slice(0, 40))
    out += b < 0x20 || b >= 0x7f ? '?' : String.fromCharCode(b);
  return encoder.encode(s).length > 40 ? out + '...' : out;
}

class CronError extends Error {}

function isAlpha(c: string|undefined): boolean {
  return !!c && /^[A-Za-z]$/.test(c);
}

// The set of values of one field, as bits over min..max.
function parseField(f: Field, text: string, expr: string): Set<number> {
  const fail = (what: string): never => {
    throw new CronError(`invalid cron expression "${shown(expr)}": field '${f.name}' ${what}`);
  };
  const number = (v: string, what: string): number => {
    if (!v || v.length > 4 || !/^[0-9]+$/.test(v)) fail(`has an invalid ${what} '${shown(v)}'`);
    return Number(v);
  };
  const value = (v: string): number => {
    if (!v) fail('has an empty value');
    if (f.names && isAlpha(v[0])) {
      const i = f.names.indexOf(v.toUpperCase());
      if (i < 0) fail(`has an unknown name '${shown(v)}'`);
      return f.min + i;
    }
    const n = number(v, 'value');
    if (n < f.min || n > f.max) fail(`value '${shown(v)}' is out of range ${f.min}-${f.max}`);
    return n;
  };
  const out = new Set<number>();
  for (const item of text.split(',')) {
    if (!item) fail(`has an empty list item in '${shown(text)}'`);
    let base = item;
    let step: number|null = null;
    const slash = item.indexOf('/');
    if (slash >= 0) {
      base = item.slice(0, slash);
      const s = item.slice(slash + 1);
      const n = number(s, 'step');
      const span = f.max - f.min + 1;
      if (n < 1 || n > span) fail(`step '${shown(s)}' is out of range 1-${span}`);
      step = n;
      if (!base) fail(`has a step without a range in '${shown(item)}'`);
    }
    let lo = f.min;
    let hi = f.max;
    if (base !== '*') {
      const dash = base.indexOf('-');
      lo = value(dash < 0 ? base : base.slice(0, dash));
      if (dash >= 0) {
        const end = base.slice(dash + 1);
        hi = value(end);
        // SUN ending a range is 7 (MON-SUN, SAT-SUN).
        if (f.names === WEEKDAYS && hi === 0 && lo > hi && isAlpha(end[0])) hi = 7;
        if (lo > hi) fail(`range '${shown(base)}' runs backwards`);
      } else if (step === null) {
        hi = lo;
      }
    }
    for (let v = lo; v <= hi; v += step ?? 1) out.add(v);
  }
  return out;
}

// The server's message for an expression it refuses, or null when it parses.
export function cronProblem(text: string): string|null {
  if (encoder.encode(text).length > MAX_EXPRESSION_BYTES) {
    return `cron expression is longer than ${MAX_EXPRESSION_BYTES} characters`;
  }
  const trimmed = text.trim();
  let fieldsText = trimmed;
  if (trimmed.startsWith('@')) {
    const expansion = MACROS[trimmed.toLowerCase()];
    if (!expansion) {
      return `invalid cron expression "${
          shown(
              text)}": unknown macro (expected @yearly, @annually, @monthly, @weekly, @daily, @midnight or @hourly)`;
    }
    fieldsText = expansion;
  }
  const parts = fieldsText.split(/[ \t]+/).filter(Boolean);
  if (parts.length !== FIELDS.length) {
    return `invalid cron expression "${shown(text)}": it has ${
        parts
            .length} fields; a cron expression has 5 (minute hour day-of-month month day-of-week) or is a macro such as @daily`;
  }
  try {
    const sets = FIELDS.map((f, i) => parseField(f, parts[i], text));
    const days = sets[2];
    const months = sets[3];
    if (parts[2][0] === '*' || parts[4][0] === '*') {
      // Both day fields must match: some chosen month must have one of the chosen days.
      let possible = false;
      for (const m of months)
        for (const d of days)
          if (d <= DAYS_IN_MONTH[m]) possible = true;
      if (!possible) {
        return `invalid cron expression "${
            shown(
                text)}": it never fires (no month of field 'month' has a day of field 'day-of-month')`;
      }
    }
  } catch (e) {
    if (e instanceof CronError) return e.message;
    throw e;
  }
  return null;
}

// The server's message for a zone name the browser does not know either, or null. Zone names
// are case-sensitive on the server, while the browser's Intl takes any case: a segment must
// start as tzdata's do (Europe/Berlin, America/Argentina/Buenos_Aires, Etc/GMT+5, EST5EDT).
export function zoneProblem(name: string): string|null {
  const bad = `unknown time zone: "${shown(name)}" (an IANA name such as Europe/Berlin or UTC)`;
  if (!name || encoder.encode(name).length > 64) return bad;
  if (!/^[A-Z][A-Za-z0-9_+-]*(\/[A-Z0-9][A-Za-z0-9_+-]*)*$/.test(name)) return bad;
  try {
    new Intl.DateTimeFormat('en', {timeZone: name});
  } catch {
    return bad;
  }
  return null;
}
