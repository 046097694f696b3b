//! An answer's `data` checked against its endpoint's object type and count
//! rule, so that whichever provider answered, callers get the shape the
//! description promises, and an answer of any other shape is refused as a
//! malformed one.
//!
//! Every field is present, none other is; each has its type, `null` only
//! where the field is nullable. Refusals name the path (`data[3].likes`)
//! and what is wrong, never the value: an upstream may echo anything into
//! a field, a key included, and refusals reach the log.

use crate::description::{Answer, Endpoint, Field, FieldType, ObjectType, Shape, StringField};
use serde_json::Value;
use std::fmt;

/// Why an answer does not match its description. `path` is where, from
/// `data`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnswerError {
    #[error("{path}: not an object")]
    NotAnObject { path: DataPath },
    #[error("{path}: not a list")]
    NotAList { path: DataPath },
    #[error("{path}: {items} items where at most {most} were asked")]
    TooMany {
        path: DataPath,
        items: usize,
        most: u64,
    },
    #[error("{path}: missing")]
    Missing { path: DataPath },
    /// The extra key is not named: it is upstream text.
    #[error("{path}: a field the description does not have")]
    Extra { path: DataPath },
    #[error("{path}: null, and the field is not nullable")]
    Null { path: DataPath },
    #[error("{path}: not {expected}")]
    WrongType {
        path: DataPath,
        expected: &'static str,
    },
    #[error("{path}: an empty string, where the description says null")]
    Empty { path: DataPath },
    #[error("{path}: {problem}")]
    Invalid {
        path: DataPath,
        problem: &'static str,
    },
    /// A value the description refuses in words of its own.
    #[error("{path}: {reason}")]
    Refused { path: DataPath, reason: String },
}

impl AnswerError {
    pub fn path(&self) -> &DataPath {
        match self {
            AnswerError::NotAnObject { path }
            | AnswerError::NotAList { path }
            | AnswerError::TooMany { path, .. }
            | AnswerError::Missing { path }
            | AnswerError::Extra { path }
            | AnswerError::Null { path }
            | AnswerError::WrongType { path, .. }
            | AnswerError::Empty { path }
            | AnswerError::Invalid { path, .. }
            | AnswerError::Refused { path, .. } => path,
        }
    }
}

/// Where in `data` a check failed: `data`, `data[3]`, `data[3].likes`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataPath {
    item: Option<usize>,
    field: Option<String>,
}

impl DataPath {
    fn at(item: Option<usize>, field: Option<&str>) -> DataPath {
        DataPath {
            item,
            field: field.map(str::to_owned),
        }
    }
}

impl fmt::Display for DataPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("data")?;
        if let Some(item) = self.item {
            write!(f, "[{item}]")?;
        }
        if let Some(field) = &self.field {
            write!(f, ".{field}")?;
        }
        Ok(())
    }
}

impl Endpoint {
    /// Checks an answer's `data`. `page_size` is the page size asked
    /// ([`Validated::page_size`](crate::Validated::page_size)), which
    /// bounds a list's length by the count rule; one object ignores it.
    pub fn check_answer(&self, data: &Value, page_size: Option<u64>) -> Result<(), AnswerError> {
        self.answer().check(data, page_size)
    }
}

impl Answer {
    /// As [`Endpoint::check_answer`].
    pub fn check(&self, data: &Value, page_size: Option<u64>) -> Result<(), AnswerError> {
        let object = self.object();
        match self.shape() {
            Shape::One => check_object(object, data, None),
            Shape::List { count_rule, .. } => {
                let Value::Array(items) = data else {
                    return Err(AnswerError::NotAList {
                        path: DataPath::at(None, None),
                    });
                };
                if let Some(most) = page_size.map(|size| count_rule.most_items(size)) {
                    if items.len() as u64 > most {
                        return Err(AnswerError::TooMany {
                            path: DataPath::at(None, None),
                            items: items.len(),
                            most,
                        });
                    }
                }
                items
                    .iter()
                    .enumerate()
                    .try_for_each(|(i, item)| check_object(object, item, Some(i)))
            }
        }
    }
}

fn check_object(
    object: &ObjectType,
    value: &Value,
    item: Option<usize>,
) -> Result<(), AnswerError> {
    let Value::Object(map) = value else {
        return Err(AnswerError::NotAnObject {
            path: DataPath::at(item, None),
        });
    };
    for field in object.fields() {
        let path = || DataPath::at(item, Some(field.name()));
        match map.get(field.name()) {
            None => return Err(AnswerError::Missing { path: path() }),
            Some(Value::Null) if field.nullable() => {}
            Some(Value::Null) => return Err(AnswerError::Null { path: path() }),
            Some(value) => check_field(field, value).map_err(|e| e.at(path()))?,
        }
    }
    // Every field is present and field names are unique, so any other
    // key makes the map longer.
    if map.len() > object.fields().len() {
        return Err(AnswerError::Extra {
            path: DataPath::at(item, None),
        });
    }
    Ok(())
}

/// What is wrong with a field's (non-null) value, placed by the caller.
enum Defect {
    WrongType(&'static str),
    Empty,
    Invalid(&'static str),
    Refused(String),
}

impl Defect {
    fn at(self, path: DataPath) -> AnswerError {
        match self {
            Defect::WrongType(expected) => AnswerError::WrongType { path, expected },
            Defect::Empty => AnswerError::Empty { path },
            Defect::Invalid(problem) => AnswerError::Invalid { path, problem },
            Defect::Refused(reason) => AnswerError::Refused { path, reason },
        }
    }
}

fn check_field(field: &Field, value: &Value) -> Result<(), Defect> {
    let text = || value.as_str().ok_or(Defect::WrongType("a string"));
    match field.kind() {
        FieldType::Integer => value
            .as_u64()
            .map(drop)
            .ok_or(Defect::WrongType("a whole number from 0 to 2^64 - 1")),
        FieldType::Boolean => value
            .as_bool()
            .map(drop)
            .ok_or(Defect::WrongType("a boolean")),
        FieldType::Id => is_id(text()?)
            .then_some(())
            .ok_or(Defect::Invalid("not an ID of 1-20 digits")),
        FieldType::Timestamp => is_timestamp(text()?)
            .then_some(())
            .ok_or(Defect::Invalid("not a time written YYYY-MM-DDTHH:MM:SSZ")),
        FieldType::Enum(values) => {
            let text = text()?;
            values
                .iter()
                .any(|v| v == text)
                .then_some(())
                .ok_or(Defect::Invalid(
                    "not one of the values the description lists",
                ))
        }
        FieldType::String(rule) => check_string(rule, text()?),
    }
}

fn check_string(rule: &StringField, text: &str) -> Result<(), Defect> {
    if rule.never_empty && text.is_empty() {
        return Err(Defect::Empty);
    }
    if let Some((_, reason)) = rule.refusals.iter().find(|(p, _)| p.matches(text)) {
        return Err(Defect::Refused(reason.clone()));
    }
    if let Some((least, most)) = rule.length {
        if !(least..=most).contains(&text.chars().count()) {
            return Err(Defect::Invalid("a length outside the description's"));
        }
    }
    if rule.pattern.as_ref().is_some_and(|p| !p.matches(text)) {
        return Err(Defect::Invalid("does not match the description's pattern"));
    }
    if rule.url && !is_web_url(text) {
        return Err(Defect::Invalid("not an http(s) URL"));
    }
    Ok(())
}

/// 1-20 ASCII digits, no sign: IDs may exceed 2^64, so they stay text.
pub(crate) fn is_id(text: &str) -> bool {
    (1..=20).contains(&text.len()) && text.bytes().all(|b| b.is_ascii_digit())
}

/// Exactly `YYYY-MM-DDTHH:MM:SSZ`, and a real date and time of day.
pub(crate) fn is_timestamp(text: &str) -> bool {
    let b = text.as_bytes();
    let shape = b.len() == 20
        && b[4] == b'-'
        && b[7] == b'-'
        && b[10] == b'T'
        && b[13] == b':'
        && b[16] == b':'
        && b[19] == b'Z';
    if !shape {
        return false;
    }
    let num = |from: usize, to: usize| -> Option<u32> {
        let digits = &b[from..to];
        digits
            .iter()
            .all(u8::is_ascii_digit)
            .then(|| digits.iter().fold(0, |n, d| n * 10 + u32::from(d - b'0')))
    };
    let (Some(year), Some(month), Some(day)) = (num(0, 4), num(5, 7), num(8, 10)) else {
        return false;
    };
    let (Some(hour), Some(minute), Some(second)) = (num(11, 13), num(14, 16), num(17, 19)) else {
        return false;
    };
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    let days = match month {
        2 if leap => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        1..=12 => 31,
        _ => return false,
    };
    (1..=days).contains(&day) && hour <= 23 && minute <= 59 && second <= 59
}

/// Whether `url` is an `http://` or `https://` URL with a host, and none of
/// the ASCII characters that could end a quoted HTML attribute, a tag or a
/// line (controls, space, `"`, `<`, `>`, `\`, `` ` ``): a client may put it
/// straight into a page.
pub(crate) fn is_web_url(url: &str) -> bool {
    let unfit = |byte: u8| {
        byte <= b' ' || byte == 0x7f || matches!(byte, b'"' | b'<' | b'>' | b'\\' | b'`')
    };
    // The host: what the authority holds after any user and before any
    // port (`https://:80/a` and `https://@/a` have none).
    let has_host = |rest: &str| {
        let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
        let host_and_port = authority
            .rsplit_once('@')
            .map_or(authority, |(_, after)| after);
        !host_and_port.is_empty() && !host_and_port.starts_with(':')
    };
    match url.split_once("://") {
        Some((scheme, rest)) => {
            (scheme.eq_ignore_ascii_case("http") || scheme.eq_ignore_ascii_case("https"))
                && has_host(rest)
                && !url.bytes().any(unfit)
        }
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_exact_and_real() {
        for good in [
            "2025-11-21T04:40:00Z",
            "2000-02-29T00:00:00Z",
            "0000-01-01T00:00:00Z",
            "9999-12-31T23:59:59Z",
        ] {
            assert!(is_timestamp(good), "{good}");
        }
        for bad in [
            "2025-02-29T00:00:00Z",
            "1900-02-29T00:00:00Z",
            "2025-13-01T00:00:00Z",
            "2025-00-01T00:00:00Z",
            "2025-11-00T00:00:00Z",
            "2025-11-21 04:40:00Z",
            "2025-11-21T24:00:00Z",
            "2025-11-21T04:60:00Z",
            "2025-11-21T04:40:60Z",
            "2025-11-21T04:40:00",
            "2025-11-21T04:40:00+00:00",
            "+025-11-21T04:40:00Z",
            "2025-1a-21T04:40:00Z",
            "",
        ] {
            assert!(!is_timestamp(bad), "{bad}");
        }
    }

    #[test]
    fn ids_are_one_to_twenty_digits() {
        for good in ["0", "7301234567890123456", "99999999999999999999"] {
            assert!(is_id(good), "{good}");
        }
        for bad in [
            "",
            "-5",
            "+5",
            " 5",
            "1e5",
            "abc",
            "123456789012345678901",
            "٣",
        ] {
            assert!(!is_id(bad), "{bad}");
        }
    }

    #[test]
    fn web_urls_only() {
        for good in [
            "https://example.com/a.jpg",
            "HTTP://example.com",
            "https://user@host:8080/p?q#f",
            "https://exämple.com/ü",
        ] {
            assert!(is_web_url(good), "{good}");
        }
        for bad in [
            "javascript:alert(1)",
            "data:image/png;base64,AAAA",
            "/relative/path",
            "ftp://example.com/a",
            "https://",
            "https://:80/a",
            "https://@/a",
            "https://example.com/a b",
            "https://example.com/\"onload=",
            "https://example.com/<script>",
            "https://example.com/a\\b",
            "https://example.com/`",
            "https://example.com/\n",
        ] {
            assert!(!is_web_url(bad), "{bad}");
        }
    }

    #[test]
    fn paths_read_as_json_paths() {
        assert_eq!(DataPath::at(None, None).to_string(), "data");
        assert_eq!(DataPath::at(Some(3), None).to_string(), "data[3]");
        assert_eq!(
            DataPath::at(Some(3), Some("likes")).to_string(),
            "data[3].likes"
        );
        assert_eq!(DataPath::at(None, Some("bio")).to_string(), "data.bio");
    }
}
