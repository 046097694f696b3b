//! A checked description: what [`load`](crate::load) builds from a file
//! once every name resolves and every rule holds, and what the rest of the
//! service reads. Its parts can only be made by loading a file, so holding
//! one means holding a description that passed every check.

use regex::Regex;
use serde_json::value::RawValue;
use std::sync::Arc;

/// One platform's endpoints, parameters and objects.
#[derive(Debug, Clone)]
pub struct Description {
    pub(crate) version: String,
    pub(crate) name: String,
    pub(crate) title: String,
    pub(crate) summary: String,
    pub(crate) openapi_prefix: Option<String>,
    pub(crate) endpoints: Vec<Endpoint>,
    pub(crate) objects: Vec<Arc<ObjectType>>,
}

impl Description {
    /// The format version the file declared (`1.0`, ...).
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The platform's name, its `/v1/{name}/...` path segment.
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn title(&self) -> &str {
        &self.title
    }

    pub fn summary(&self) -> &str {
        &self.summary
    }

    /// What the API document's component names and default
    /// `operationId`s start with, when the file gives it (`""` included).
    pub fn openapi_prefix(&self) -> Option<&str> {
        self.openapi_prefix.as_deref()
    }

    /// Every endpoint, in the file's order.
    pub fn endpoints(&self) -> &[Endpoint] {
        &self.endpoints
    }

    /// The endpoint of an exact, case-sensitive path segment.
    pub fn endpoint(&self, name: &str) -> Option<&Endpoint> {
        self.endpoints.iter().find(|e| e.name == name)
    }

    /// Every object type, in the file's order.
    pub fn objects(&self) -> &[Arc<ObjectType>] {
        &self.objects
    }

    pub fn object(&self, name: &str) -> Option<&Arc<ObjectType>> {
        self.objects.iter().find(|o| o.name == name)
    }
}

/// One endpoint, `GET /v1/{platform}/{name}`.
#[derive(Debug, Clone)]
pub struct Endpoint {
    pub(crate) name: String,
    pub(crate) summary: String,
    pub(crate) description: Option<String>,
    pub(crate) operation_id: Option<String>,
    pub(crate) parameters: Vec<Parameter>,
    /// Index into `parameters`: a string parameter.
    pub(crate) subject: usize,
    pub(crate) answer: Answer,
    pub(crate) cache_ttl_s: u64,
    pub(crate) cost: u32,
    pub(crate) example: Box<RawValue>,
    pub(crate) not_found: bool,
    pub(crate) links: Vec<Link>,
}

impl Endpoint {
    /// The path segment.
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn summary(&self) -> &str {
        &self.summary
    }

    /// Longer text for the API document, when the file gives one.
    pub fn description(&self) -> Option<&str> {
        self.description.as_deref()
    }

    /// The API document's `operationId`, when the file gives one.
    pub fn operation_id(&self) -> Option<&str> {
        self.operation_id.as_deref()
    }

    /// Every parameter, in the file's order (the cursor included).
    pub fn parameters(&self) -> &[Parameter] {
        &self.parameters
    }

    /// The parameter of this name, if the endpoint reads it.
    pub fn parameter(&self, name: &str) -> Option<&Parameter> {
        self.parameters.iter().find(|p| p.name == name)
    }

    /// Whether the endpoint reads the query parameter `name`; it ignores
    /// any other.
    pub fn reads(&self, name: &str) -> bool {
        self.parameter(name).is_some()
    }

    /// The parameter that names what the endpoint is about: cursors are
    /// bound to its value and caches keyed by it. Always a string.
    pub fn subject(&self) -> &Parameter {
        &self.parameters[self.subject]
    }

    /// A list's page-size parameter (an integer); `None` for one object.
    pub fn page_size(&self) -> Option<&Parameter> {
        match self.answer.shape {
            Shape::List { page_size, .. } => Some(&self.parameters[page_size]),
            Shape::One => None,
        }
    }

    /// A list's cursor parameter; `None` for one object (a list always has
    /// one).
    pub fn cursor(&self) -> Option<&Parameter> {
        self.parameters
            .iter()
            .find(|p| matches!(p.kind, ParameterKind::Cursor))
    }

    pub fn answer(&self) -> &Answer {
        &self.answer
    }

    /// Whether answers are lists that carry a `next_cursor`.
    pub fn is_list(&self) -> bool {
        matches!(self.answer.shape, Shape::List { .. })
    }

    /// How long an answer is cached when the operator says nothing else;
    /// zero: not cached.
    pub fn cache_ttl_s(&self) -> u64 {
        self.cache_ttl_s
    }

    /// What an answer costs when the operator says nothing else.
    pub fn cost(&self) -> u32 {
        self.cost
    }

    /// The `data` of an example answer, as the file wrote it; it passed the
    /// answer check.
    pub fn example(&self) -> &RawValue {
        &self.example
    }

    /// Whether the subject names something that may not exist, so that a
    /// provider's "not found" is the answer (`404 RESOURCE_NOT_FOUND`);
    /// `false` for a search, which has nothing to be missing: no match is
    /// an empty answer, and "not found" is a failed attempt.
    pub fn not_found(&self) -> bool {
        self.not_found
    }

    /// The endpoints an answer leads to, in the file's order.
    pub fn links(&self) -> &[Link] {
        &self.links
    }
}

/// An answer leads to another endpoint of the platform: the value of
/// `field` in the answer's object (a list's first item) is that endpoint's
/// subject.
#[derive(Debug, Clone)]
pub struct Link {
    pub(crate) endpoint: String,
    pub(crate) summary: String,
    pub(crate) field: String,
}

impl Link {
    /// The endpoint it leads to, one of the platform's.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    pub fn summary(&self) -> &str {
        &self.summary
    }

    /// A field of the answer's object.
    pub fn field(&self) -> &str {
        &self.field
    }
}

/// A query parameter.
#[derive(Debug, Clone)]
pub struct Parameter {
    pub(crate) name: String,
    pub(crate) summary: Option<String>,
    pub(crate) example: Option<String>,
    pub(crate) openapi_name: Option<String>,
    /// Declared under `[parameters]` and named by endpoints, rather than
    /// in place.
    pub(crate) shared: bool,
    pub(crate) kind: ParameterKind,
}

impl Parameter {
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn summary(&self) -> Option<&str> {
        self.summary.as_deref()
    }

    /// An example value for the API document.
    pub fn example(&self) -> Option<&str> {
        self.example.as_deref()
    }

    pub fn kind(&self) -> &ParameterKind {
        &self.kind
    }

    /// The API document's component name, when the file gives one.
    pub fn openapi_name(&self) -> Option<&str> {
        self.openapi_name.as_deref()
    }

    /// Whether it is declared once under `[parameters]` for any endpoint
    /// to name, rather than in place in one endpoint.
    pub fn shared(&self) -> bool {
        self.shared
    }
}

/// What a parameter holds and the rule it is checked by.
#[derive(Debug, Clone)]
pub enum ParameterKind {
    /// Required: an empty or absent one is missing.
    String(StringRule),
    /// Optional: an empty or absent one takes the default.
    Integer(IntegerRule),
    /// The host's opaque paging token: resolved by the host, not here.
    Cursor,
}

/// How a string parameter is taken: the value is transformed in this
/// order (drop the prefix, NFC, lowercase), then checked.
#[derive(Debug, Clone)]
pub struct StringRule {
    pub(crate) drop_prefix: Option<String>,
    pub(crate) nfc: bool,
    pub(crate) lowercase: bool,
    pub(crate) refusals: Vec<(Pattern, String)>,
    pub(crate) length: (usize, usize),
    pub(crate) pattern: Option<Pattern>,
    pub(crate) rule: String,
}

impl StringRule {
    /// One leading occurrence of this is dropped.
    pub fn drop_prefix(&self) -> Option<&str> {
        self.drop_prefix.as_deref()
    }

    /// Whether the value is normalized to NFC.
    pub fn nfc(&self) -> bool {
        self.nfc
    }

    /// Whether the value is lowercased (Unicode's default lowercasing).
    pub fn lowercase(&self) -> bool {
        self.lowercase
    }

    /// Values refused with their own reason, before the general rule.
    pub fn refusals(&self) -> &[(Pattern, String)] {
        &self.refusals
    }

    /// The least and most characters, after the transformation.
    pub fn length(&self) -> (usize, usize) {
        self.length
    }

    pub fn pattern(&self) -> Option<&Pattern> {
        self.pattern.as_ref()
    }

    /// What a value must be, in words: refusals read "must be {rule}".
    pub fn rule(&self) -> &str {
        &self.rule
    }
}

/// An integer parameter: plain decimal digits within `min..=max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IntegerRule {
    pub min: u64,
    pub max: u64,
    /// Within `min..=max`.
    pub default: u64,
}

/// A regular expression that must match a whole value.
#[derive(Debug, Clone)]
pub struct Pattern {
    pub(crate) source: String,
    /// `source` anchored at both ends.
    pub(crate) regex: Regex,
}

impl Pattern {
    /// The expression as the file wrote it (unanchored).
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Whether `text` matches as a whole.
    pub fn matches(&self, text: &str) -> bool {
        self.regex.is_match(text)
    }
}

/// What an answer's `data` is.
#[derive(Debug, Clone)]
pub struct Answer {
    pub(crate) object: Arc<ObjectType>,
    pub(crate) shape: Shape,
}

impl Answer {
    /// The type of the object, or of the list's items.
    pub fn object(&self) -> &Arc<ObjectType> {
        &self.object
    }

    pub fn shape(&self) -> &Shape {
        &self.shape
    }
}

/// One object, or a list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    One,
    List {
        /// Index of the page-size parameter among the endpoint's.
        page_size: usize,
        count_rule: CountRule,
    },
}

/// How many items a page of a list may hold, given the page size asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CountRule {
    /// The page size, while that many remain; never more.
    Exact,
    /// Approximate: at most the page size plus `extra`.
    AtMost { extra: u32 },
}

impl CountRule {
    /// The most items a page may hold when `page_size` were asked.
    pub fn most_items(self, page_size: u64) -> u64 {
        match self {
            CountRule::Exact => page_size,
            CountRule::AtMost { extra } => page_size.saturating_add(u64::from(extra)),
        }
    }
}

/// An object type: its fields in answer order.
#[derive(Debug, Clone)]
pub struct ObjectType {
    pub(crate) name: String,
    pub(crate) summary: Option<String>,
    pub(crate) plural: Option<String>,
    pub(crate) fields: Vec<Field>,
}

impl ObjectType {
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn summary(&self) -> Option<&str> {
        self.summary.as_deref()
    }

    /// The name in the plural, when the file gives it.
    pub fn plural(&self) -> Option<&str> {
        self.plural.as_deref()
    }

    /// Every field, in answer order; every one is always present.
    pub fn fields(&self) -> &[Field] {
        &self.fields
    }

    pub fn field(&self, name: &str) -> Option<&Field> {
        self.fields.iter().find(|f| f.name == name)
    }
}

/// A field of an object type.
#[derive(Debug, Clone)]
pub struct Field {
    pub(crate) name: String,
    pub(crate) summary: Option<String>,
    pub(crate) nullable: bool,
    pub(crate) kind: FieldType,
}

impl Field {
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn summary(&self) -> Option<&str> {
        self.summary.as_deref()
    }

    /// Whether the field may be `null` (it is present all the same).
    pub fn nullable(&self) -> bool {
        self.nullable
    }

    pub fn kind(&self) -> &FieldType {
        &self.kind
    }
}

/// What a field holds.
#[derive(Debug, Clone)]
pub enum FieldType {
    String(StringField),
    /// A whole number from 0 to 2^64 - 1 (every count the service carries).
    Integer,
    Boolean,
    /// UTC to the second, exactly `YYYY-MM-DDTHH:MM:SSZ`.
    Timestamp,
    /// A string from a fixed set.
    Enum(Vec<String>),
    /// An ID carried exactly as a string of 1-20 decimal digits.
    Id,
}

/// The checks of a string field.
#[derive(Debug, Clone)]
pub struct StringField {
    /// `""` is refused: the answer must say `null` instead.
    pub(crate) never_empty: bool,
    /// The least and most characters.
    pub(crate) length: Option<(usize, usize)>,
    pub(crate) pattern: Option<Pattern>,
    /// Values refused with a reason, checked before `length` and `pattern`.
    pub(crate) refusals: Vec<(Pattern, String)>,
    /// An `http://` or `https://` URL a client may show or follow.
    pub(crate) url: bool,
}

impl StringField {
    pub fn never_empty(&self) -> bool {
        self.never_empty
    }

    pub fn length(&self) -> Option<(usize, usize)> {
        self.length
    }

    pub fn pattern(&self) -> Option<&Pattern> {
        self.pattern.as_ref()
    }

    /// Values refused with their own reason, before the other checks.
    pub fn refusals(&self) -> &[(Pattern, String)] {
        &self.refusals
    }

    /// Whether the value must be an `http(s)` URL.
    pub fn url(&self) -> bool {
        self.url
    }
}
