// Checks a memory search query in the page with the server's rules and words
// (src/keel/memory/query.cc, docs/MEMORY.md section 2), so that a query it would refuse is
// explained without a request that fails. Returns null when the query parses.

const MAX_QUERY_BYTES = 512;
const MAX_QUERY_TERMS = 16;
const MAX_TAG_BYTES = 64;

const encoder = new TextEncoder();

// A character of a word, as the server's tokenizer splits them.
function isWordChar(c: number): boolean {
  if (c < 0x80)
    return (c >= 0x30 && c <= 0x39) || (c >= 0x61 && c <= 0x7a) || (c >= 0x41 && c <= 0x5a);
  if (c < 0xa0) return false;
  if (c >= 0x2000 && c <= 0x206f) return false;
  if (c >= 0xa0 && c <= 0xbf)
    return c === 0xaa || c === 0xb2 || c === 0xb3 || c === 0xb5 || c === 0xb9 || c === 0xba ||
        (c >= 0xbc && c <= 0xbe);
  return c !== 0xd7 && c !== 0xf7;
}

function hasWord(chars: string[]): boolean {
  return chars.some((ch) => isWordChar(ch.codePointAt(0)!));
}

const isSpace = (ch: string|undefined) =>
    ch === ' ' || ch === '\t' || ch === '\n' || ch === '\r' || ch === '\f' || ch === '\v';

export function queryProblem(text: string): string|null {
  const bytes = encoder.encode(text).length;
  if (bytes > MAX_QUERY_BYTES)
    return `the query is longer than ${MAX_QUERY_BYTES} bytes (${bytes})`;
  const s = Array.from(text);  // code points: positions count characters from 1
  if (s.some((ch) => ch === '\u0000')) return 'the query contains a NUL character';
  const at = (i: number) => ` at position ${i + 1}`;
  let positive = 0;
  let excluded = 0;
  let lastExcluded = false;
  let anyToken = false;
  let pendingOr = -1;
  let terms = 0;
  let i = 0;
  for (;;) {
    while (i < s.length && isSpace(s[i])) i++;
    if (i === s.length) break;
    const start = i;
    let isExcluded = false;
    if (s[i] === '-') {
      if (i + 1 === s.length || isSpace(s[i + 1])) return `'-'${at(i)} has no term after it`;
      isExcluded = true;
      i++;
    }
    if (s[i] === '"') {
      const close = s.indexOf('"', i + 1);
      if (close < 0) return `unbalanced quote: the '"'${at(i)} is not closed`;
      if (!hasWord(s.slice(i + 1, close))) return `the phrase${at(i)} has no words to search for`;
      i = close + 1;
      while (i < s.length && s[i] === '*') i++;
    } else {
      const begin = i;
      while (i < s.length && !isSpace(s[i]) && s[i] !== '"') i++;
      const raw = s.slice(begin, i);
      if (raw.join('') === 'OR' && !isExcluded) {
        if (!anyToken || pendingOr >= 0) return `OR${at(start)} has no term before it`;
        if (lastExcluded) return `OR${at(start)} cannot join an excluded term (-word)`;
        pendingOr = start;
        continue;
      }
      if (!hasWord(raw)) continue;  // only punctuation: nothing to search for
    }
    if (++terms > MAX_QUERY_TERMS) return `the query has more than ${MAX_QUERY_TERMS} terms`;
    anyToken = true;
    lastExcluded = isExcluded;
    if (isExcluded) {
      if (pendingOr >= 0) return `OR${at(pendingOr)} cannot join an excluded term (-word)`;
      excluded++;
    } else if (pendingOr >= 0) {
      pendingOr = -1;
    } else {
      positive++;
    }
  }
  if (pendingOr >= 0) return `OR${at(pendingOr)} has no term after it`;
  if (positive === 0) {
    if (excluded) return 'the query has only excluded terms (-word); add a term to search for';
    return 'the query is empty: give at least one word to search for';
  }
  return null;
}

export function tagProblem(tag: string): string|null {
  const n = encoder.encode(tag).length;
  if (n === 0 || n > MAX_TAG_BYTES) return `a tag is 1 to ${MAX_TAG_BYTES} bytes, got ${n}`;
  if (/[\u0000-\u001f\u007f]/.test(tag)) return 'a tag may not hold control characters';
  if (!tag.trim()) return 'a tag may not be only white space';
  return null;
}
