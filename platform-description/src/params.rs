//! A caller's query parameters checked against an endpoint's rules, before
//! any provider is asked, so invalid input never reaches an upstream.
//!
//! The rules every platform shares: an empty value counts as missing; a
//! parameter the endpoint reads may be given once (twice is refused, even
//! with equal values); any other is ignored, however often it appears;
//! integers are plain decimal digits within their range, refused, never
//! clamped; the cursor is the host's opaque token, not looked at here (but
//! a second one is refused all the same).

use crate::description::{Endpoint, ParameterKind, StringRule};
use std::borrow::Cow;
use unicode_normalization::{is_nfc_quick, IsNormalized, UnicodeNormalization};

/// Why a caller's parameters were refused. `Display` is safe to show the
/// caller: `parameter `{name}` {reason}`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParamError {
    #[error("parameter `{name}` is required")]
    Missing { name: String },
    #[error("parameter `{name}` is given more than once")]
    Repeated { name: String },
    /// `reason` is the whole text after the name, `must be ...`.
    #[error("parameter `{name}` {reason}")]
    Invalid { name: String, reason: String },
}

impl ParamError {
    /// The parameter at fault.
    pub fn name(&self) -> &str {
        match self {
            ParamError::Missing { name }
            | ParamError::Repeated { name }
            | ParamError::Invalid { name, .. } => name,
        }
    }

    /// What is wrong with it, in words a caller can act on.
    pub fn reason(&self) -> &str {
        match self {
            ParamError::Missing { .. } => "is required",
            ParamError::Repeated { .. } => "is given more than once",
            ParamError::Invalid { reason, .. } => reason,
        }
    }
}

/// A parameter's value once taken.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Value {
    String(String),
    Integer(u64),
}

/// An endpoint's parameters once checked: every string and integer
/// parameter's value (integers at their default when absent), in the
/// endpoint's order; the cursor is not among them.
#[derive(Debug, Clone)]
pub struct Validated<'e> {
    endpoint: &'e Endpoint,
    values: Vec<(&'e str, Value)>,
}

impl<'e> Validated<'e> {
    pub fn endpoint(&self) -> &'e Endpoint {
        self.endpoint
    }

    /// The values by name, in the endpoint's order.
    pub fn values(&self) -> &[(&'e str, Value)] {
        &self.values
    }

    pub fn get(&self, name: &str) -> Option<&Value> {
        self.values.iter().find(|(n, _)| *n == name).map(|(_, v)| v)
    }

    /// The subject's value, normalized.
    pub fn subject(&self) -> &str {
        match self.get(self.endpoint.subject().name()) {
            Some(Value::String(subject)) => subject,
            // A loaded endpoint's subject is a string parameter, and a
            // string parameter always has a value once validated.
            _ => unreachable!("the subject is a string parameter"),
        }
    }

    /// The page size asked for (or its default); `None` for one object.
    pub fn page_size(&self) -> Option<u64> {
        match self.get(self.endpoint.page_size()?.name()) {
            Some(Value::Integer(size)) => Some(*size),
            _ => unreachable!("the page size is an integer parameter"),
        }
    }

    /// The most items the answer's list may hold; `None` for one object.
    pub fn most_items(&self) -> Option<u64> {
        let rule = match self.endpoint.answer().shape() {
            crate::Shape::List { count_rule, .. } => *count_rule,
            crate::Shape::One => return None,
        };
        Some(rule.most_items(self.page_size()?))
    }
}

impl Endpoint {
    /// Checks a caller's query-string parameters, already form-decoded.
    pub fn validate<'a, I>(&self, params: I) -> Result<Validated<'_>, ParamError>
    where
        I: IntoIterator<Item = (&'a str, &'a str)>,
    {
        // Each parameter the endpoint reads, seen at most once.
        let mut given: Vec<Option<&'a str>> = vec![None; self.parameters.len()];
        for (name, value) in params {
            let Some(slot) = self.parameters.iter().position(|p| p.name == name) else {
                continue;
            };
            if given[slot].replace(value).is_some() {
                return Err(ParamError::Repeated { name: name.into() });
            }
        }
        let mut values = Vec::with_capacity(self.parameters.len());
        for (param, raw) in self.parameters.iter().zip(given) {
            let raw = raw.filter(|v| !v.is_empty());
            let value = match &param.kind {
                ParameterKind::Cursor => continue,
                ParameterKind::String(rule) => {
                    let raw = raw.ok_or_else(|| ParamError::Missing {
                        name: param.name.clone(),
                    })?;
                    Value::String(
                        take_string(rule, raw).map_err(|reason| ParamError::Invalid {
                            name: param.name.clone(),
                            reason,
                        })?,
                    )
                }
                ParameterKind::Integer(rule) => Value::Integer(match raw {
                    None => rule.default,
                    Some(text) => {
                        let digits = text.bytes().all(|b| b.is_ascii_digit());
                        match text.parse::<u64>() {
                            Ok(n) if digits && (rule.min..=rule.max).contains(&n) => n,
                            _ => {
                                return Err(ParamError::Invalid {
                                    name: param.name.clone(),
                                    reason: format!(
                                        "must be an integer from {} to {}",
                                        rule.min, rule.max
                                    ),
                                })
                            }
                        }
                    }
                }),
            };
            values.push((param.name.as_str(), value));
        }
        Ok(Validated {
            endpoint: self,
            values,
        })
    }
}

/// A string value transformed and checked; the error is the reason.
fn take_string(rule: &StringRule, raw: &str) -> Result<String, String> {
    let mut text = Cow::Borrowed(raw);
    if let Some(prefix) = &rule.drop_prefix {
        if let Some(rest) = raw.strip_prefix(prefix.as_str()) {
            text = Cow::Borrowed(rest);
        }
    }
    if rule.nfc && is_nfc_quick(text.chars()) != IsNormalized::Yes {
        text = Cow::Owned(text.nfc().collect());
    }
    if rule.lowercase && text.chars().any(|c| c.is_uppercase() || !c.is_ascii()) {
        text = Cow::Owned(text.to_lowercase());
    }
    if let Some((_, reason)) = rule.refusals.iter().find(|(p, _)| p.matches(&text)) {
        return Err(reason.clone());
    }
    let chars = text.chars().count();
    let (least, most) = rule.length;
    let fits =
        (least..=most).contains(&chars) && rule.pattern.as_ref().is_none_or(|p| p.matches(&text));
    if !fits {
        return Err(format!("must be {}", rule.rule));
    }
    Ok(text.into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::description::Pattern;

    fn rule(prefix: Option<&str>, nfc: bool, lowercase: bool) -> StringRule {
        let regex = regex::Regex::new(r"\A(?:[\p{L}\p{M}]+)\z").unwrap();
        StringRule {
            drop_prefix: prefix.map(str::to_owned),
            nfc,
            lowercase,
            refusals: vec![],
            length: (1, 3),
            pattern: Some(Pattern {
                source: r"[\p{L}\p{M}]+".into(),
                regex,
            }),
            rule: "1-3 letters".into(),
        }
    }

    #[test]
    fn steps_run_in_order_then_the_checks() {
        // One leading prefix only.
        let r = rule(Some("#"), false, false);
        assert_eq!(take_string(&r, "#ab").unwrap(), "ab");
        assert_eq!(take_string(&r, "##ab").unwrap_err(), "must be 1-3 letters");
        assert_eq!(take_string(&r, "ab").unwrap(), "ab");
        // Lengths count characters after NFC: e + U+0301 three times is 3.
        let r = rule(None, true, false);
        assert_eq!(take_string(&r, "e\u{301}e\u{301}e\u{301}").unwrap(), "ééé");
        let r = rule(None, false, false);
        assert!(take_string(&r, "e\u{301}e\u{301}e\u{301}").is_err());
        // Lowercasing is Unicode's, after NFC.
        let r = rule(None, true, true);
        assert_eq!(take_string(&r, "E\u{301}Ä").unwrap(), "éä");
        assert_eq!(take_string(&r, "ΟΔΟΣ").unwrap_err(), "must be 1-3 letters");
        assert_eq!(take_string(&r, "ΟΣ").unwrap(), "ος");
    }
}
