//! The `tenants` column of `rate_limit_usage` and `quota_leases` (SPEC 23.2): the
//! names as a JSON array of strings, `["user:a","team:x"]`, so that SQLite's own
//! `json_each` reads them; NULL for none. Written in one exact form (no spaces; `"`,
//! `\` and control characters escaped, every other character as itself) and read
//! back exactly, as any JSON writer (a plain `sqlite3` session's `json_array`) may
//! have written it.
use crate::core::tenants::TenantList;
use std::fmt::Write as _;
use std::sync::Arc;

/// The column's value for these tenants: `None` (NULL) for none.
pub(super) fn stored(tenants: &[Arc<str>]) -> Option<String> {
    (!tenants.is_empty()).then(|| encode(tenants))
}

/// A JSON array of the names.
pub(super) fn encode(tenants: &[Arc<str>]) -> String {
    let mut out = String::with_capacity(2 + tenants.iter().map(|t| t.len() + 3).sum::<usize>());
    out.push('[');
    for (i, t) in tenants.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push('"');
        for c in t.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                c if u32::from(c) < 0x20 => {
                    let _ = write!(out, "\\u{:04x}", u32::from(c));
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }
    out.push(']');
    out
}

/// The names of a JSON array of strings; `None` when the text is not one (a value a
/// plain writer spoiled).
pub(super) fn decode(text: &str) -> Option<Vec<String>> {
    let b = text.as_bytes();
    let mut i = 0;
    let ws = |i: &mut usize| {
        while b.get(*i).is_some_and(|c| matches!(c, b' ' | b'\t' | b'\n' | b'\r')) {
            *i += 1;
        }
    };
    ws(&mut i);
    if b.get(i) != Some(&b'[') {
        return None;
    }
    i += 1;
    ws(&mut i);
    let mut out = Vec::new();
    if b.get(i) == Some(&b']') {
        i += 1;
    } else {
        loop {
            ws(&mut i);
            out.push(string(text, &mut i)?);
            ws(&mut i);
            match b.get(i)? {
                b',' => i += 1,
                b']' => {
                    i += 1;
                    break;
                }
                _ => return None,
            }
        }
    }
    ws(&mut i);
    (i == b.len()).then_some(out)
}

/// One JSON string starting at `*i` (its opening quote); leaves `*i` past its end.
fn string(text: &str, i: &mut usize) -> Option<String> {
    let b = text.as_bytes();
    if b.get(*i) != Some(&b'"') {
        return None;
    }
    *i += 1;
    let mut out = String::new();
    // Runs between escapes are copied whole: they start and end at ASCII bytes, so
    // at character boundaries.
    let mut run = *i;
    loop {
        match *b.get(*i)? {
            b'"' => {
                out.push_str(&text[run..*i]);
                *i += 1;
                return Some(out);
            }
            b'\\' => {
                out.push_str(&text[run..*i]);
                let e = *b.get(*i + 1)?;
                *i += 2;
                out.push(match e {
                    b'"' => '"',
                    b'\\' => '\\',
                    b'/' => '/',
                    b'b' => '\u{8}',
                    b'f' => '\u{c}',
                    b'n' => '\n',
                    b'r' => '\r',
                    b't' => '\t',
                    b'u' => {
                        let hi = hex4(b, i)?;
                        if (0xD800..0xDC00).contains(&hi) {
                            // A character beyond the BMP: a surrogate pair.
                            if b.get(*i..*i + 2) != Some(b"\\u") {
                                return None;
                            }
                            *i += 2;
                            let lo = hex4(b, i)?;
                            if !(0xDC00..0xE000).contains(&lo) {
                                return None;
                            }
                            char::from_u32(0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00))?
                        } else {
                            // A lone low surrogate is no character.
                            char::from_u32(hi)?
                        }
                    }
                    _ => return None,
                });
                run = *i;
            }
            _ => *i += 1,
        }
    }
}

/// Four hex digits at `*i`, as a number; leaves `*i` past them.
fn hex4(b: &[u8], i: &mut usize) -> Option<u32> {
    let digits = std::str::from_utf8(b.get(*i..*i + 4)?).ok()?;
    if !digits.bytes().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    *i += 4;
    u32::from_str_radix(digits, 16).ok()
}

/// Reads the column (NULL, or a spoiled value: none), sharing one list per distinct
/// value within a batch of rows and one allocation per distinct name.
#[derive(Default)]
pub(super) struct TenantLists {
    none: TenantList,
    lists: std::collections::HashMap<Box<str>, TenantList>,
}

impl TenantLists {
    pub(super) fn get(
        &mut self, v: rusqlite::types::ValueRef<'_>, mut name: impl FnMut(&str) -> Arc<str>,
    ) -> TenantList {
        let rusqlite::types::ValueRef::Text(bytes) = v else { return self.none.clone() };
        let Ok(text) = std::str::from_utf8(bytes) else { return self.none.clone() };
        if let Some(l) = self.lists.get(text) {
            return l.clone();
        }
        let list: TenantList = match decode(text) {
            Some(list) => list.iter().map(|n| name(n)).collect(),
            None => self.none.clone(),
        };
        self.lists.insert(Box::from(text), list.clone());
        list
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(names: &[&str]) -> Vec<Arc<str>> {
        names.iter().map(|n| Arc::from(*n)).collect()
    }

    #[test]
    fn names_round_trip_exactly() {
        let names = [
            "user:a",
            "team:x",
            "",
            "quote\"d",
            "back\\slash",
            "\\u0041",
            "ctl\u{1}\u{1f}\u{1e}\n\r\t\u{8}\u{c}\u{7f}",
            "émoji 🦀 \u{2028} 中文",
            "/slash/",
            "[\"a\",\"b\"]",
        ];
        for n in names {
            let one = list(&[n]);
            assert_eq!(decode(&encode(&one)), Some(vec![n.to_string()]), "{n:?}");
        }
        let all = list(&names);
        let text = encode(&all);
        assert_eq!(decode(&text), Some(names.iter().map(|n| n.to_string()).collect()));
        assert_eq!(encode(&list(&["user:a", "team:x"])), r#"["user:a","team:x"]"#);
        assert_eq!(encode(&list(&["a\"b\\c\u{1}"])), r#"["a\"b\\c\u0001"]"#);
        assert_eq!(stored(&[]), None);
    }

    #[test]
    fn what_other_json_writers_write_is_read() {
        assert_eq!(decode(" [ \"a\" , \"b\" ] "), Some(vec!["a".into(), "b".into()]));
        assert_eq!(decode("[]"), Some(vec![]));
        assert_eq!(decode(r#"["\u00e9\ud83e\udd80\/"]"#), Some(vec!["é🦀/".into()]));
        for bad in [
            "",
            "[",
            "[\"a\"",
            "[\"a\",]",
            "[1]",
            "{}",
            "[\"a\"] x",
            "[\"\\x\"]",
            "[\"\\ud83e\"]",
            "[\"\\udd80\"]",
        ] {
            assert_eq!(decode(bad), None, "{bad:?}");
        }
    }

    /// Whatever SQLite's own JSON functions make of the column, and what they write,
    /// agree with it.
    #[test]
    fn sqlite_reads_and_writes_the_same_json() {
        let c = rusqlite::Connection::open_in_memory().expect("sqlite");
        let names = ["user:a", "quote\"d", "back\\slash", "ctl\u{1}\n", "é🦀"];
        let text = encode(&list(&names));
        let got: Vec<String> = c
            .prepare("SELECT value FROM json_each(?1) ORDER BY key")
            .and_then(|mut s| s.query_map([&text], |r| r.get(0))?.collect())
            .expect("json_each");
        assert_eq!(got, names);
        let made: String = c
            .query_row("SELECT json_array(?1, ?2, ?3, ?4, ?5)", rusqlite::params_from_iter(names), |r| {
                r.get(0)
            })
            .expect("json_array");
        assert_eq!(decode(&made), Some(names.iter().map(|n| n.to_string()).collect()));
    }
}
