#include "keel/memory/query.h"

#include <string>
#include <vector>

namespace keel::memory {

namespace {

// One search term: a word or a phrase (several words in a row), perhaps with its last word a
// prefix, perhaps excluded.
struct Term {
  std::vector<std::string> words;
  bool prefix = false;
  bool excluded = false;
};

// The length of the UTF-8 sequence starting `s`, or 0 when it is not a valid one (overlong
// forms, surrogates and values past U+10FFFF included). *cp gets its code point.
size_t DecodeUtf8(std::string_view s, char32_t* cp) {
  const auto c = static_cast<unsigned char>(s[0]);
  const size_t len = c < 0x80           ? 1
                     : (c >> 5) == 0x6  ? 2
                     : (c >> 4) == 0xE  ? 3
                     : (c >> 3) == 0x1E ? 4
                                        : 0;
  if (len == 0 || len > s.size()) return 0;
  char32_t v = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
  for (size_t k = 1; k < len; ++k) {
    const auto b = static_cast<unsigned char>(s[k]);
    if ((b & 0xC0) != 0x80) return 0;
    v = (v << 6) | (b & 0x3F);
  }
  if ((len == 2 && v < 0x80) || (len == 3 && v < 0x800) || (len == 4 && v < 0x10000) ||
      (v >= 0xD800 && v <= 0xDFFF) || v > 0x10FFFF) {
    return 0;
  }
  *cp = v;
  return len;
}

// Whether a code point belongs to a word. ASCII: letters and digits. Beyond ASCII the
// backends' own tokenizers decide (both take letters and digits); the common punctuation is
// treated as a separator here too, so that a term made of it alone is left out rather than
// searched for as nothing. PostgreSQL's memories.tsv splits the text with the same classes
// (postgres_tx.cc, the memories migration).
bool IsWordChar(char32_t c) {
  if (c < 0x80) return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
  if (c < 0xA0) return false;                    // control characters
  if (c >= 0x2000 && c <= 0x206F) return false;  // General Punctuation: dashes, quotes, ...
  if (c >= 0xA0 && c <= 0xBF) {                  // Latin-1 signs, but its letters and digits
    return c == 0xAA || c == 0xB2 || c == 0xB3 || c == 0xB5 || c == 0xB9 || c == 0xBA ||
           (c >= 0xBC && c <= 0xBE);
  }
  return c != 0xD7 && c != 0xF7;  // multiplication and division signs
}

bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

// The words of `s`: its runs of word characters. REQUIRES: `s` is valid UTF-8.
std::vector<std::string> Words(std::string_view s) {
  std::vector<std::string> words;
  std::string word;
  size_t i = 0;
  while (i < s.size()) {
    char32_t cp = 0;
    const size_t len = DecodeUtf8(s.substr(i), &cp);
    if (IsWordChar(cp)) {
      word.append(s.substr(i, len));
    } else if (!word.empty()) {
      words.push_back(std::move(word));
      word.clear();
    }
    i += len;
  }
  if (!word.empty()) words.push_back(std::move(word));
  return words;
}

std::string Fts5Term(const Term& t) {
  std::string out = "\"$";
  for (const auto& w : t.words) out += " " + w;
  out += "\"";
  if (t.prefix) out += " *";
  return out;
}

std::string TsqueryTerm(const Term& t) {
  std::string out;
  for (size_t i = 0; i < t.words.size(); ++i) {
    out += (i ? " <-> '" : "'") + t.words[i] + "'";
  }
  if (t.prefix) out += ":*";
  return t.words.size() > 1 ? "(" + out + ")" : out;
}

template <typename RenderFn>
std::string Group(const std::vector<Term>& group, const char* op, RenderFn render) {
  std::string out;
  for (size_t i = 0; i < group.size(); ++i) out += (i ? op : "") + render(group[i]);
  return group.size() > 1 ? "(" + out + ")" : out;
}

}  // namespace

Result<store::MemoryQuery> ParseQuery(std::string_view text) {
  if (text.size() > kMaxQueryBytes) {
    return InvalidArgument("the query is longer than " + std::to_string(kMaxQueryBytes) +
                           " bytes (" + std::to_string(text.size()) + ")");
  }
  // Positions are counted in characters, from 1; the text must be UTF-8 to count them.
  std::vector<size_t> position_of(text.size() + 1);
  {
    size_t chars = 0;
    size_t i = 0;
    while (i < text.size()) {
      char32_t cp = 0;
      const size_t len = DecodeUtf8(text.substr(i), &cp);
      if (len == 0) {
        return InvalidArgument("the query is not valid UTF-8 (at byte " + std::to_string(i + 1) +
                               ")");
      }
      if (cp == 0) return InvalidArgument("the query contains a NUL character");
      for (size_t k = 0; k < len; ++k) position_of[i + k] = chars + 1;
      ++chars;
      i += len;
    }
    position_of[text.size()] = chars + 1;
  }
  auto at = [&](size_t byte) { return " at position " + std::to_string(position_of[byte]); };

  std::vector<std::vector<Term>> groups;  // positive terms; OR joins those within a group
  std::vector<Term> excluded;
  bool last_excluded = false;  // the previous token was an excluded term
  bool any_token = false;
  size_t pending_or = std::string_view::npos;  // an OR waiting for its right-hand term
  int terms = 0;
  size_t i = 0;
  while (true) {
    while (i < text.size() && IsSpace(text[i])) ++i;
    if (i == text.size()) break;
    const size_t start = i;
    Term term;
    if (text[i] == '-') {
      if (i + 1 == text.size() || IsSpace(text[i + 1])) {
        return InvalidArgument("'-'" + at(i) + " has no term after it");
      }
      term.excluded = true;
      ++i;
    }
    if (text[i] == '"') {
      const size_t close = text.find('"', i + 1);
      if (close == std::string_view::npos) {
        return InvalidArgument("unbalanced quote: the '\"'" + at(i) + " is not closed");
      }
      term.words = Words(text.substr(i + 1, close - i - 1));
      if (term.words.empty()) {
        return InvalidArgument("the phrase" + at(i) + " has no words to search for");
      }
      i = close + 1;
      while (i < text.size() && text[i] == '*') {
        term.prefix = true;
        ++i;
      }
    } else {
      const size_t begin = i;
      while (i < text.size() && !IsSpace(text[i]) && text[i] != '"') ++i;
      std::string_view raw = text.substr(begin, i - begin);
      if (raw == "OR" && !term.excluded) {
        if (!any_token || pending_or != std::string_view::npos) {
          return InvalidArgument("OR" + at(start) + " has no term before it");
        }
        if (last_excluded) {
          return InvalidArgument("OR" + at(start) + " cannot join an excluded term (-word)");
        }
        pending_or = start;
        continue;
      }
      while (!raw.empty() && raw.back() == '*') {
        term.prefix = true;
        raw.remove_suffix(1);
      }
      term.words = Words(raw);
      if (term.words.empty()) continue;  // only punctuation: nothing to search for
    }
    if (++terms > kMaxQueryTerms) {
      return InvalidArgument("the query has more than " + std::to_string(kMaxQueryTerms) +
                             " terms");
    }
    any_token = true;
    last_excluded = term.excluded;
    if (term.excluded) {
      if (pending_or != std::string_view::npos) {
        return InvalidArgument("OR" + at(pending_or) + " cannot join an excluded term (-word)");
      }
      excluded.push_back(std::move(term));
    } else if (pending_or != std::string_view::npos) {
      groups.back().push_back(std::move(term));
      pending_or = std::string_view::npos;
    } else {
      groups.push_back({std::move(term)});
    }
  }
  if (pending_or != std::string_view::npos) {
    return InvalidArgument("OR" + at(pending_or) + " has no term after it");
  }
  if (groups.empty()) {
    if (!excluded.empty()) {
      return InvalidArgument("the query has only excluded terms (-word); add a term to search for");
    }
    return InvalidArgument("the query is empty: give at least one word to search for");
  }

  store::MemoryQuery out;
  for (size_t g = 0; g < groups.size(); ++g) {
    out.fts5 += (g ? " AND " : "") + Group(groups[g], " OR ", Fts5Term);
    out.tsquery += (g ? " & " : "") + Group(groups[g], " | ", TsqueryTerm);
  }
  for (const auto& group : groups) {
    for (const auto& term : group) {
      for (size_t w = 0; w < term.words.size(); ++w) {
        const bool prefix = term.prefix && w + 1 == term.words.size();
        out.tsquery_rank +=
            (out.tsquery_rank.empty() ? "'" : " | '") + term.words[w] + "'" + (prefix ? ":*" : "");
      }
    }
  }
  if (!excluded.empty()) {
    out.fts5 = "(" + out.fts5 + ")";
    if (groups.size() > 1) out.tsquery = "(" + out.tsquery + ")";
    for (const auto& t : excluded) {
      out.fts5 += " NOT " + Fts5Term(t);
      out.tsquery += " & !" + TsqueryTerm(t);
    }
  }
  return out;
}

}  // namespace keel::memory
