//! The serde types of a description file, as written: what keys exist and
//! what each holds. Nothing here is checked beyond its TOML type; [`load`]
//! turns a [`File`] into a checked [`Description`].
//!
//! Every table refuses keys it does not know, so a misspelt key is an error
//! rather than a silently missing rule. Order that matters (endpoints,
//! their parameters, an object's fields) is an array's order, so it is the
//! file's order.
//!
//! [`load`]: crate::load
//! [`Description`]: crate::Description

use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};
use std::collections::BTreeMap;
use std::fmt;

/// A whole description file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct File {
    /// The format's version, `"1.0"`.
    pub version: String,
    /// The platform's name: the `/v1/{name}/...` path segment.
    pub name: String,
    pub title: String,
    pub summary: String,
    /// What the API document's component names and default `operationId`s
    /// start with; the platform's name in UpperCamel case when absent.
    pub openapi_prefix: Option<String>,
    /// Parameters several endpoints read, declared once by name.
    #[serde(default)]
    pub parameters: BTreeMap<String, Parameter>,
    pub endpoints: Vec<Endpoint>,
    pub objects: Vec<Object>,
}

/// The first thing read of a file: its version alone, so a file of a later
/// format is refused for its version, not for the keys it may have added.
#[derive(Debug, Deserialize)]
pub struct VersionOnly {
    pub version: Option<toml::Value>,
}

/// One endpoint, `GET /v1/{platform}/{name}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Endpoint {
    pub name: String,
    pub summary: String,
    /// Longer text for the API document.
    pub description: Option<String>,
    /// The API document's `operationId`.
    pub operation_id: Option<String>,
    /// In the order the API document lists them.
    pub parameters: Vec<ParameterRef>,
    /// The parameter cursors are bound to and caches keyed by.
    pub subject: String,
    pub answer: Answer,
    pub cache_ttl_s: u64,
    pub cost: u32,
    /// The `data` of an answer, as JSON text (TOML has no `null`).
    pub example: String,
    /// Whether the subject can be missing (`404 RESOURCE_NOT_FOUND`); a
    /// search has nothing to be missing. `true` when absent.
    pub not_found: Option<bool>,
    /// Other endpoints an answer leads to, for the API document.
    #[serde(default)]
    pub links: Vec<Link>,
}

/// An answer leads to another endpoint: its subject is a field of the
/// answer's object (of a list's first item).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Link {
    /// The endpoint it leads to.
    pub endpoint: String,
    pub summary: String,
    /// The field that gives the subject; the subject's name when absent.
    pub field: Option<String>,
}

/// A parameter of an endpoint: the name of a shared one, or one declared
/// in place.
#[derive(Debug)]
pub enum ParameterRef {
    Shared(String),
    Inline(Box<Parameter>),
}

impl<'de> Deserialize<'de> for ParameterRef {
    /// A string or a table, read by hand rather than as an untagged enum so
    /// a mistake inside an inline table is reported as that mistake, with
    /// its key, not as "matches no variant".
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct RefVisitor;
        impl<'de> Visitor<'de> for RefVisitor {
            type Value = ParameterRef;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a shared parameter's name, or a parameter table")
            }
            fn visit_str<E: de::Error>(self, name: &str) -> Result<ParameterRef, E> {
                Ok(ParameterRef::Shared(name.to_owned()))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<ParameterRef, A::Error> {
                Parameter::deserialize(de::value::MapAccessDeserializer::new(map))
                    .map(|p| ParameterRef::Inline(Box::new(p)))
            }
        }
        deserializer.deserialize_any(RefVisitor)
    }
}

/// A query parameter's rule.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Parameter {
    /// In place only; a shared parameter is named by its key.
    pub name: Option<String>,
    #[serde(rename = "type")]
    pub kind: ParameterKind,
    pub summary: Option<String>,
    /// An example value for the API document.
    pub example: Option<String>,
    /// The API document's component name for it, instead of the default.
    pub openapi_name: Option<String>,
    // `string`:
    /// Characters, after the steps below.
    pub length: Option<[u64; 2]>,
    pub pattern: Option<String>,
    pub drop_prefix: Option<String>,
    pub normalize: Option<Normalize>,
    pub case: Option<Case>,
    /// What a refused value must be, as in "must be {rule}".
    pub rule: Option<String>,
    /// Values refused in words of their own, checked before `length` and
    /// `pattern`.
    #[serde(default)]
    pub refuse: Vec<Refusal>,
    // `integer`:
    pub range: Option<[u64; 2]>,
    pub default: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ParameterKind {
    String,
    Integer,
    Cursor,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Normalize {
    Nfc,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Case {
    Lower,
}

/// A value refused with a reason of its own (`"must not be made of dots
/// only"`), where the general rule's words would mislead.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Refusal {
    pub pattern: String,
    /// The whole reason after the parameter's name.
    pub reason: String,
}

/// What an answer's `data` is: one object, or a list.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Answer {
    /// One object of this type.
    pub one: Option<String>,
    /// A list of objects of this type.
    pub list: Option<String>,
    /// A list's page-size parameter.
    pub page_size: Option<String>,
    pub count_rule: Option<CountRule>,
    /// With `at_most`: how many items beyond the page size a page may hold.
    pub extra: Option<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CountRule {
    Exact,
    AtMost,
}

/// An object type.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Object {
    pub name: String,
    pub summary: Option<String>,
    /// The name in the plural, for the API document; English rules when
    /// absent.
    pub plural: Option<String>,
    /// In answer order.
    pub fields: Vec<Field>,
}

/// A field of an object type.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Field {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: FieldKind,
    #[serde(default)]
    pub nullable: bool,
    #[serde(default)]
    pub never_empty: bool,
    /// `enum`: the values allowed.
    pub values: Option<Vec<String>>,
    // `string`:
    pub length: Option<[u64; 2]>,
    pub pattern: Option<String>,
    /// Values refused, checked before `length` and `pattern`.
    #[serde(default)]
    pub refuse: Vec<Refusal>,
    pub format: Option<Format>,
    pub summary: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FieldKind {
    String,
    Integer,
    Boolean,
    Timestamp,
    Enum,
    Id,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    Url,
}
