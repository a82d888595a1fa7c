//! Ids as stored: as they are, escaped when PostgreSQL's `text` cannot hold them, hashed
//! when too long for the primary key's index.

use std::borrow::Cow;

/// Starts an id stored escaped. PostgreSQL's `text` cannot hold NUL, which a key taken
/// from a JSON string may: such an id (and any id starting with this marker or
/// [`HASHED_ID`]) is stored as the marker and the id with `\` doubled and NUL written
/// `\0`. The mapping is one to one, so no two ids share a row, and every other id is
/// stored as it is.
const ESCAPED_ID: char = '\u{1}';

/// Starts an id stored as the SHA-256 of the id: an escaped id longer than
/// [`MAX_STORED_ID_BYTES`] (escaping can double an id, and a primary key entry must fit
/// PostgreSQL's 2704-byte index limit). Read back, a record's id is the id it was asked
/// for, never this form.
const HASHED_ID: char = '\u{2}';

/// The longest id stored escaped; longer ones are stored hashed.
const MAX_STORED_ID_BYTES: usize = 2048;

/// The form `id` is stored in (the `id` column).
pub(super) fn stored_id(id: &str) -> Cow<'_, str> {
    if !id.contains('\0') && !id.starts_with([ESCAPED_ID, HASHED_ID]) {
        return Cow::Borrowed(id);
    }
    let mut stored = String::with_capacity(id.len() + 8);
    stored.push(ESCAPED_ID);
    for c in id.chars() {
        match c {
            '\\' => stored.push_str("\\\\"),
            '\0' => stored.push_str("\\0"),
            c => stored.push(c),
        }
    }
    if stored.len() > MAX_STORED_ID_BYTES {
        let hash = crate::key::sha256_hex(id.as_bytes());
        return Cow::Owned(format!("{HASHED_ID}{hash}"));
    }
    Cow::Owned(stored)
}

/// What the stored forms of the ids starting with `prefix` start with: the plain form
/// (`None` when no id stored as it is can start with `prefix`: it holds a NUL or starts
/// with a marker) and the escaped one (escaping maps each character on its own, so an
/// escaped id starts with the escaped prefix). Ids stored hashed start with neither.
pub(super) fn stored_prefixes(prefix: &str) -> (Option<&str>, String) {
    let plain =
        (!prefix.contains('\0') && !prefix.starts_with([ESCAPED_ID, HASHED_ID])).then_some(prefix);
    let mut escaped = String::with_capacity(prefix.len() + 8);
    escaped.push(ESCAPED_ID);
    for c in prefix.chars() {
        match c {
            '\\' => escaped.push_str("\\\\"),
            '\0' => escaped.push_str("\\0"),
            c => escaped.push(c),
        }
    }
    (plain, escaped)
}

/// The inverse of [`stored_id`] for ids stored as they are or escaped (a listed row's
/// id); `None` for an id stored hashed, which cannot be inverted.
pub(super) fn listed_id(stored: String) -> Option<String> {
    (!stored.starts_with(HASHED_ID)).then(|| read_id(stored))
}

/// The inverse of [`stored_id`] for ids stored escaped (a record read back takes the id it
/// was asked for; this checks that the mapping is one to one).
fn read_id(stored: String) -> String {
    let Some(escaped) = stored.strip_prefix(ESCAPED_ID) else {
        return stored;
    };
    let mut id = String::with_capacity(escaped.len());
    let mut chars = escaped.chars();
    while let Some(c) = chars.next() {
        match (c, c == '\\') {
            (_, true) => match chars.next() {
                Some('0') => id.push('\0'),
                Some(other) => id.push(other),
                None => id.push('\\'),
            },
            (c, false) => id.push(c),
        }
    }
    id
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_postgres_cannot_hold_are_escaped_one_to_one() {
        let ids = [
            "f.op#plain",
            "f.op#back\\slash",
            "f.op#nul\0here",
            "f.op#nul\\0lookalike",
            "\u{1}f.op#marker",
            "\u{1}",
            "\u{2}f.op#hashed-marker",
            "\0",
            "\\",
            "",
        ];
        let mut stored = std::collections::HashSet::new();
        for id in ids {
            let s = stored_id(id);
            assert!(!s.contains('\0'), "{id:?} is stored without NUL: {s:?}");
            assert_eq!(read_id(s.to_string()), id, "{id:?} reads back");
            assert!(
                stored.insert(s.to_string()),
                "{id:?} shares its stored form"
            );
        }
        assert!(matches!(stored_id("f.op#plain"), Cow::Borrowed(_)));
        assert!(matches!(stored_id("f.op#back\\slash"), Cow::Borrowed(_)));
    }
}
