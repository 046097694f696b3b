//! Reading a description file and checking it into a [`Description`].
//!
//! A file is refused, never half-taken: a bad description must fail a
//! check or a reload with the file, the place and the reason, and leave
//! what serves as it was. Places follow the file's structure, arrays
//! counted from 0: `endpoints[2].parameters[1].range`,
//! `parameters.username.pattern`, `objects[0].fields[4].values`.
//!
//! The version is read first, on its own, so a file of a later format is
//! refused for its version, not for a key this build does not know.

use crate::description::{
    Answer, CountRule, Description, Endpoint, Field, FieldType, IntegerRule, Link, ObjectType,
    Parameter, ParameterKind, Pattern, Shape, StringField, StringRule,
};
use crate::model;
use regex::Regex;
use serde_json::value::RawValue;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The major version of the format this build reads; any `1.N` is read.
pub const MAJOR_VERSION: u64 = 1;

/// The longest default cache lifetime a description may give: a year, the
/// most an operator may set.
pub const MAX_CACHE_TTL_S: u64 = 365 * 24 * 3600;

/// Why a description file was refused. `Display` gives the file, the place
/// and the reason on one line.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{}: cannot be read: {source}", file.display())]
    Unreadable {
        file: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Not TOML, or a key or value of the wrong kind for the format.
    #[error("{0}")]
    Malformed(Refusal),
    /// A version this build does not read.
    #[error("{0}")]
    Version(Refusal),
    /// Well-formed, but a rule of the format does not hold.
    #[error("{0}")]
    Invalid(Refusal),
}

impl LoadError {
    /// Where in the file; `None` when it could not be read.
    pub fn place(&self) -> Option<&str> {
        match self {
            LoadError::Unreadable { .. } => None,
            LoadError::Malformed(r) | LoadError::Version(r) | LoadError::Invalid(r) => {
                Some(&r.place)
            }
        }
    }
}

/// What a refused file is refused for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {place}: {reason}", file.display())]
pub struct Refusal {
    pub file: PathBuf,
    /// The key path, arrays counted from 0, with the line where known.
    pub place: String,
    pub reason: String,
}

/// A refusal before it is given its file.
struct Fault {
    place: String,
    reason: String,
}

impl Fault {
    fn in_file(self, file: &Path) -> Refusal {
        Refusal {
            file: file.to_owned(),
            place: self.place,
            reason: self.reason,
        }
    }
}

fn fault(place: impl Into<String>, reason: impl Into<String>) -> Fault {
    Fault {
        place: place.into(),
        reason: reason.into(),
    }
}

type Checked<T> = Result<T, Fault>;

impl Description {
    /// Reads and checks the description at `path`, which `[platforms.X]`
    /// names `platform`: the file's `name` must be that.
    pub fn load(path: &Path, platform: &str) -> Result<Description, LoadError> {
        let text = std::fs::read_to_string(path).map_err(|source| LoadError::Unreadable {
            file: path.to_owned(),
            source,
        })?;
        Description::parse(&text, path, platform)
    }

    /// Checks a description's text; `file` only names it in refusals.
    pub fn parse(text: &str, file: &Path, platform: &str) -> Result<Description, LoadError> {
        let malformed = |f: Fault| LoadError::Malformed(f.in_file(file));
        let first: model::VersionOnly = read(text).map_err(malformed)?;
        let version =
            check_version(first.version).map_err(|f| LoadError::Version(f.in_file(file)))?;
        let raw: model::File = read(text).map_err(malformed)?;
        check(raw, version, platform).map_err(|f| LoadError::Invalid(f.in_file(file)))
    }
}

/// Deserializes `text`, a refusal naming the key path and the line.
fn read<T: serde::de::DeserializeOwned>(text: &str) -> Checked<T> {
    serde_path_to_error::deserialize(toml::Deserializer::new(text)).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let line = inner
            .span()
            .map(|span| text[..span.start.min(text.len())].matches('\n').count() + 1);
        let place = match (path.as_str(), line) {
            (".", Some(line)) => format!("line {line}"),
            (".", None) => "the file".to_owned(),
            (path, Some(line)) => format!("{path} (line {line})"),
            (path, None) => path.to_owned(),
        };
        // toml's messages may run over lines; a refusal is one line.
        let reason = inner.message().trim_end().replace('\n', "; ");
        fault(place, reason)
    })
}

fn check_version(version: Option<toml::Value>) -> Checked<String> {
    let reads = format!("this build reads versions {MAJOR_VERSION}.x");
    let Some(version) = version else {
        return Err(fault(
            "version",
            format!("missing: a description starts with version = \"{MAJOR_VERSION}.0\""),
        ));
    };
    let Some(text) = version.as_str() else {
        return Err(fault(
            "version",
            format!("must be a string such as \"{MAJOR_VERSION}.0\""),
        ));
    };
    let number = |part: &str| {
        (!part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()))
            .then(|| part.parse::<u64>().ok())
            .flatten()
    };
    match text.split_once('.') {
        Some((major, minor)) if number(major).is_some() && number(minor).is_some() => {
            if number(major) == Some(MAJOR_VERSION) {
                Ok(text.to_owned())
            } else {
                Err(fault(
                    "version",
                    format!("version \"{text}\" is not one this build reads: {reads}"),
                ))
            }
        }
        _ => Err(fault(
            "version",
            format!("\"{text}\" is not a version such as \"{MAJOR_VERSION}.0\""),
        )),
    }
}

/// Whether `name` is a lowercase letter followed by lowercase letters,
/// digits and `extra`: usable as a path segment, a query parameter, a JSON
/// key and an identifier in generated code alike.
fn well_formed(name: &str, extra: u8) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 64
        && b[0].is_ascii_lowercase()
        && b.iter()
            .all(|&c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == extra)
}

fn name_rule(place: String, name: &str, extra: u8) -> Checked<()> {
    if well_formed(name, extra) {
        return Ok(());
    }
    let chars = if extra == b'-' {
        "a-z 0-9 -"
    } else {
        "a-z 0-9 _"
    };
    Err(fault(
        place,
        format!("{name:?} is not a name: 1-64 characters of {chars}, starting with a letter"),
    ))
}

fn not_empty(place: String, text: &str) -> Checked<()> {
    if text.trim().is_empty() {
        return Err(fault(place, "must not be empty"));
    }
    Ok(())
}

/// Whether `name` can start or be an API document component name or
/// `operationId`: `A-Z a-z 0-9`, an upper-case letter first, at most 64.
fn document_name(place: String, name: &str, may_be_empty: bool) -> Checked<()> {
    let b = name.as_bytes();
    let fits = (b.is_empty() && may_be_empty)
        || (!b.is_empty()
            && b.len() <= 64
            && b[0].is_ascii_uppercase()
            && b.iter().all(u8::is_ascii_alphanumeric));
    if fits {
        return Ok(());
    }
    Err(fault(
        place,
        format!("{name:?} is not a name for the API document: 1-64 of A-Z a-z 0-9, starting with an upper-case letter"),
    ))
}

/// Refusals as written, `[{ pattern, reason }]`, checked.
fn refusals(place: &str, raw: Vec<model::Refusal>) -> Checked<Vec<(Pattern, String)>> {
    let mut out = Vec::with_capacity(raw.len());
    for (i, refusal) in raw.into_iter().enumerate() {
        let at = format!("{place}.refuse[{i}]");
        not_empty(format!("{at}.reason"), &refusal.reason)?;
        out.push((
            pattern(format!("{at}.pattern"), &refusal.pattern)?,
            refusal.reason,
        ));
    }
    Ok(out)
}

fn pattern(place: String, source: &str) -> Checked<Pattern> {
    // Compiled alone first: a source with an unbalanced group could
    // otherwise change the anchored expression's meaning.
    let anchored = Regex::new(source).and_then(|_| Regex::new(&format!(r"\A(?:{source})\z")));
    match anchored {
        Ok(regex) => Ok(Pattern {
            source: source.to_owned(),
            regex,
        }),
        Err(e) => {
            let message = e.to_string();
            // The last line says what is wrong; the ones above draw it.
            let last = message.lines().last().unwrap_or_default().trim();
            let what = last.strip_prefix("error: ").unwrap_or(last);
            Err(fault(place, format!("not a regular expression: {what}")))
        }
    }
}

fn ordered(place: String, [least, most]: [u64; 2]) -> Checked<(u64, u64)> {
    if least > most {
        return Err(fault(place, format!("[{least}, {most}] is not in order")));
    }
    Ok((least, most))
}

fn length(place: String, bounds: [u64; 2]) -> Checked<(usize, usize)> {
    let (least, most) = ordered(place.clone(), bounds)?;
    let fit = |n: u64| usize::try_from(n).map_err(|_| fault(place.clone(), "too long a length"));
    Ok((fit(least)?, fit(most)?))
}

/// A key the file must give.
fn required<T>(value: Option<T>, place: &str, reason: &str) -> Checked<T> {
    value.ok_or_else(|| fault(place, reason))
}

/// Refuses the keys `kind` does not take that the file gives.
fn only(place: &str, kind: &str, given: &[(&str, bool)]) -> Checked<()> {
    match given.iter().find(|(_, present)| *present) {
        Some((key, _)) => Err(fault(
            format!("{place}.{key}"),
            format!("not a key of {kind}"),
        )),
        None => Ok(()),
    }
}

fn check(raw: model::File, version: String, platform: &str) -> Checked<Description> {
    name_rule("name".into(), &raw.name, b'-')?;
    if raw.name != platform {
        return Err(fault(
            "name",
            format!(
                "{:?} is not the platform that names this file, {platform:?}",
                raw.name
            ),
        ));
    }
    not_empty("title".into(), &raw.title)?;
    not_empty("summary".into(), &raw.summary)?;
    if let Some(prefix) = &raw.openapi_prefix {
        document_name("openapi_prefix".into(), prefix, true)?;
    }

    let mut objects: Vec<Arc<ObjectType>> = Vec::with_capacity(raw.objects.len());
    for (i, object) in raw.objects.into_iter().enumerate() {
        let place = format!("objects[{i}]");
        let object = check_object(&place, object)?;
        if objects.iter().any(|o| o.name == object.name) {
            return Err(fault(
                format!("{place}.name"),
                format!("a second object type named {:?}", object.name),
            ));
        }
        objects.push(Arc::new(object));
    }

    let mut shared = BTreeMap::new();
    for (name, param) in raw.parameters {
        let place = format!("parameters.{name}");
        name_rule(place.clone(), &name, b'_')?;
        if param.name.is_some() {
            return Err(fault(
                format!("{place}.name"),
                "a shared parameter is named by its key",
            ));
        }
        let param = check_parameter(&place, name.clone(), true, param)?;
        shared.insert(name, param);
    }

    if raw.endpoints.is_empty() {
        return Err(fault("endpoints", "a platform has at least one endpoint"));
    }
    let mut endpoints: Vec<Endpoint> = Vec::with_capacity(raw.endpoints.len());
    // Links may name endpoints later in the file: checked once all are.
    let mut links = Vec::with_capacity(raw.endpoints.len());
    for (i, mut endpoint) in raw.endpoints.into_iter().enumerate() {
        let place = format!("endpoints[{i}]");
        links.push(std::mem::take(&mut endpoint.links));
        let endpoint = check_endpoint(&place, endpoint, &shared, &objects)?;
        if endpoints.iter().any(|e| e.name == endpoint.name) {
            return Err(fault(
                format!("{place}.name"),
                format!("a second endpoint named {:?}", endpoint.name),
            ));
        }
        if let Some(id) = endpoint.operation_id() {
            if endpoints.iter().any(|e| e.operation_id() == Some(id)) {
                return Err(fault(
                    format!("{place}.operation_id"),
                    format!("{id:?} is another endpoint's operation_id"),
                ));
            }
        }
        endpoints.push(endpoint);
    }
    for (i, links) in links.into_iter().enumerate() {
        endpoints[i].links = check_links(&format!("endpoints[{i}]"), i, links, &endpoints)?;
    }

    Ok(Description {
        version,
        name: raw.name,
        title: raw.title,
        summary: raw.summary,
        openapi_prefix: raw.openapi_prefix,
        endpoints,
        objects,
    })
}

/// The links of `endpoints[from]`: each to an endpoint of the file, once,
/// from a field of the answer's object that can be a subject (a string, an
/// ID or an enum's value).
fn check_links(
    place: &str,
    from: usize,
    raw: Vec<model::Link>,
    endpoints: &[Endpoint],
) -> Checked<Vec<Link>> {
    let object = endpoints[from].answer.object();
    let mut links: Vec<Link> = Vec::with_capacity(raw.len());
    for (i, link) in raw.into_iter().enumerate() {
        let at = format!("{place}.links[{i}]");
        not_empty(format!("{at}.summary"), &link.summary)?;
        let target = endpoints
            .iter()
            .find(|e| e.name == link.endpoint)
            .ok_or_else(|| {
                fault(
                    format!("{at}.endpoint"),
                    format!("{:?} is not an endpoint of the platform", link.endpoint),
                )
            })?;
        if links.iter().any(|l| l.endpoint == link.endpoint) {
            return Err(fault(
                format!("{at}.endpoint"),
                format!("a second link to {:?}", link.endpoint),
            ));
        }
        let (field_place, name) = match link.field {
            Some(name) => (format!("{at}.field"), name),
            None => (format!("{at}.endpoint"), target.subject().name.clone()),
        };
        match object.field(&name).map(Field::kind) {
            Some(FieldType::String(_) | FieldType::Id | FieldType::Enum(_)) => {}
            Some(_) => {
                return Err(fault(
                    field_place,
                    format!(
                        "{:?}'s field {name:?} is not a string, an ID or an enum: it cannot be a subject",
                        object.name
                    ),
                ))
            }
            None => {
                return Err(fault(
                    field_place,
                    format!(
                        "{:?} has no field {name:?} to give {:?}'s subject",
                        object.name, link.endpoint
                    ),
                ))
            }
        }
        links.push(Link {
            endpoint: link.endpoint,
            summary: link.summary,
            field: name,
        });
    }
    Ok(links)
}

fn check_object(place: &str, raw: model::Object) -> Checked<ObjectType> {
    name_rule(format!("{place}.name"), &raw.name, b'_')?;
    if raw.fields.is_empty() {
        return Err(fault(
            format!("{place}.fields"),
            "an object type has at least one field",
        ));
    }
    let mut fields: Vec<Field> = Vec::with_capacity(raw.fields.len());
    for (i, field) in raw.fields.into_iter().enumerate() {
        let place = format!("{place}.fields[{i}]");
        let field = check_field(&place, field)?;
        if fields.iter().any(|f| f.name == field.name) {
            return Err(fault(
                format!("{place}.name"),
                format!("a second field named {:?}", field.name),
            ));
        }
        fields.push(field);
    }
    if let Some(plural) = &raw.plural {
        not_empty(format!("{place}.plural"), plural)?;
    }
    Ok(ObjectType {
        name: raw.name,
        summary: raw.summary,
        plural: raw.plural,
        fields,
    })
}

fn check_field(place: &str, raw: model::Field) -> Checked<Field> {
    use model::FieldKind as K;
    name_rule(format!("{place}.name"), &raw.name, b'_')?;
    let string_keys = [
        ("never_empty", raw.never_empty),
        ("length", raw.length.is_some()),
        ("pattern", raw.pattern.is_some()),
        ("refuse", !raw.refuse.is_empty()),
        ("format", raw.format.is_some()),
    ];
    let values = ("values", raw.values.is_some());
    // A type that takes no key of its own.
    let plain = |kind: &str, field_type: FieldType| -> Checked<FieldType> {
        only(place, kind, &string_keys)?;
        only(place, kind, &[values])?;
        Ok(field_type)
    };
    let kind = match raw.kind {
        K::String => {
            only(place, "a string field", &[values])?;
            if raw.never_empty && !raw.nullable {
                return Err(fault(
                    format!("{place}.never_empty"),
                    "needs nullable = true: an empty value is to be null instead",
                ));
            }
            FieldType::String(StringField {
                never_empty: raw.never_empty,
                length: raw
                    .length
                    .map(|l| length(format!("{place}.length"), l))
                    .transpose()?,
                pattern: raw
                    .pattern
                    .map(|p| pattern(format!("{place}.pattern"), &p))
                    .transpose()?,
                refusals: refusals(place, raw.refuse)?,
                url: raw.format == Some(model::Format::Url),
            })
        }
        K::Enum => {
            only(place, "an enum field", &string_keys)?;
            let values = raw.values.unwrap_or_default();
            if values.is_empty() {
                return Err(fault(
                    format!("{place}.values"),
                    "an enum lists at least one value",
                ));
            }
            for (i, value) in values.iter().enumerate() {
                not_empty(format!("{place}.values[{i}]"), value)?;
                if values[..i].contains(value) {
                    return Err(fault(
                        format!("{place}.values[{i}]"),
                        format!("{value:?} is listed twice"),
                    ));
                }
            }
            FieldType::Enum(values)
        }
        K::Integer => plain("an integer field", FieldType::Integer)?,
        K::Boolean => plain("a boolean field", FieldType::Boolean)?,
        K::Timestamp => plain("a timestamp field", FieldType::Timestamp)?,
        K::Id => plain("an id field", FieldType::Id)?,
    };
    Ok(Field {
        name: raw.name,
        summary: raw.summary,
        nullable: raw.nullable,
        kind,
    })
}

/// A parameter's rule; `shared` when declared under `[parameters]`.
fn check_parameter(
    place: &str,
    name: String,
    shared: bool,
    raw: model::Parameter,
) -> Checked<Parameter> {
    use model::ParameterKind as K;
    if let Some(component) = &raw.openapi_name {
        document_name(format!("{place}.openapi_name"), component, false)?;
    }
    let string_keys = [
        ("length", raw.length.is_some()),
        ("pattern", raw.pattern.is_some()),
        ("drop_prefix", raw.drop_prefix.is_some()),
        ("normalize", raw.normalize.is_some()),
        ("case", raw.case.is_some()),
        ("rule", raw.rule.is_some()),
        ("refuse", !raw.refuse.is_empty()),
    ];
    let integer_keys = [
        ("range", raw.range.is_some()),
        ("default", raw.default.is_some()),
    ];
    let kind = match raw.kind {
        K::String => {
            only(place, "a string parameter", &integer_keys)?;
            let at = format!("{place}.length");
            let bounds = required(raw.length, &at, "a string parameter has a length")?;
            let length = length(at, bounds)?;
            if length.0 == 0 {
                return Err(fault(
                    format!("{place}.length"),
                    "at least 1: an empty value is a missing one",
                ));
            }
            let rule = required(
                raw.rule,
                &format!("{place}.rule"),
                "a string parameter says in words what it must be (\"must be {rule}\")",
            )?;
            not_empty(format!("{place}.rule"), &rule)?;
            if let Some(prefix) = &raw.drop_prefix {
                not_empty(format!("{place}.drop_prefix"), prefix)?;
            }
            ParameterKind::String(StringRule {
                drop_prefix: raw.drop_prefix,
                nfc: raw.normalize == Some(model::Normalize::Nfc),
                lowercase: raw.case == Some(model::Case::Lower),
                refusals: refusals(place, raw.refuse)?,
                length,
                pattern: raw
                    .pattern
                    .map(|p| pattern(format!("{place}.pattern"), &p))
                    .transpose()?,
                rule,
            })
        }
        K::Integer => {
            only(place, "an integer parameter", &string_keys)?;
            only(
                place,
                "an integer parameter",
                &[("example", raw.example.is_some())],
            )?;
            let at = format!("{place}.range");
            let bounds = required(raw.range, &at, "an integer parameter has a range")?;
            let (min, max) = ordered(at, bounds)?;
            let default = required(
                raw.default,
                &format!("{place}.default"),
                "an integer parameter has a default, taken when it is absent",
            )?;
            if !(min..=max).contains(&default) {
                return Err(fault(
                    format!("{place}.default"),
                    format!("{default} is outside the range [{min}, {max}]"),
                ));
            }
            ParameterKind::Integer(IntegerRule { min, max, default })
        }
        K::Cursor => {
            only(place, "a cursor parameter", &string_keys)?;
            only(place, "a cursor parameter", &integer_keys)?;
            only(
                place,
                "a cursor parameter",
                &[("example", raw.example.is_some())],
            )?;
            ParameterKind::Cursor
        }
    };
    Ok(Parameter {
        name,
        summary: raw.summary,
        example: raw.example,
        openapi_name: raw.openapi_name,
        shared,
        kind,
    })
}

fn check_endpoint(
    place: &str,
    raw: model::Endpoint,
    shared: &BTreeMap<String, Parameter>,
    objects: &[Arc<ObjectType>],
) -> Checked<Endpoint> {
    name_rule(format!("{place}.name"), &raw.name, b'_')?;
    not_empty(format!("{place}.summary"), &raw.summary)?;
    if let Some(id) = &raw.operation_id {
        let fits = id.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
            && id.chars().all(|c| c.is_ascii_alphanumeric());
        if !fits {
            return Err(fault(
                format!("{place}.operation_id"),
                format!("{id:?} is not an identifier: A-Z a-z 0-9, starting with a letter"),
            ));
        }
    }

    let mut parameters: Vec<Parameter> = Vec::with_capacity(raw.parameters.len());
    for (i, param) in raw.parameters.into_iter().enumerate() {
        let at = format!("{place}.parameters[{i}]");
        let param = match param {
            model::ParameterRef::Shared(name) => shared.get(&name).cloned().ok_or_else(|| {
                fault(
                    at.clone(),
                    format!("no shared parameter {name:?} is declared under [parameters]"),
                )
            })?,
            model::ParameterRef::Inline(param) => {
                let name = param.name.clone().ok_or_else(|| {
                    fault(
                        format!("{at}.name"),
                        "a parameter declared in place has a name",
                    )
                })?;
                name_rule(format!("{at}.name"), &name, b'_')?;
                if shared.contains_key(&name) {
                    return Err(fault(
                        format!("{at}.name"),
                        format!(
                            "{name:?} is a shared parameter's name: give the name alone to use it"
                        ),
                    ));
                }
                check_parameter(&at, name, false, *param)?
            }
        };
        if parameters.iter().any(|p| p.name == param.name) {
            return Err(fault(
                at,
                format!("a second parameter named {:?}", param.name),
            ));
        }
        if matches!(param.kind, ParameterKind::Cursor)
            && parameters
                .iter()
                .any(|p| matches!(p.kind, ParameterKind::Cursor))
        {
            return Err(fault(at, "a second cursor: an endpoint has at most one"));
        }
        parameters.push(param);
    }
    let position = |name: &str| parameters.iter().position(|p| p.name == name);

    let subject = position(&raw.subject).ok_or_else(|| {
        fault(
            format!("{place}.subject"),
            format!("{:?} is not one of the endpoint's parameters", raw.subject),
        )
    })?;
    if !matches!(parameters[subject].kind, ParameterKind::String(_)) {
        return Err(fault(
            format!("{place}.subject"),
            format!("{:?} is not a string parameter", raw.subject),
        ));
    }

    let at = format!("{place}.answer");
    let given = raw.answer;
    let type_name = match (&given.one, &given.list) {
        (Some(name), None) | (None, Some(name)) => name,
        _ => {
            return Err(fault(
                at,
                "gives one of `one` (one object) and `list` (a list of objects)",
            ))
        }
    };
    let object = objects
        .iter()
        .find(|o| o.name == *type_name)
        .cloned()
        .ok_or_else(|| {
            let key = if given.one.is_some() { "one" } else { "list" };
            fault(
                format!("{at}.{key}"),
                format!("no object type named {type_name:?} is declared under [[objects]]"),
            )
        })?;
    let has_cursor = parameters
        .iter()
        .any(|p| matches!(p.kind, ParameterKind::Cursor));
    // The page size an example is checked with: the default.
    let (shape, example_page_size) = if given.one.is_some() {
        only(
            &at,
            "a one-object answer",
            &[
                ("page_size", given.page_size.is_some()),
                ("count_rule", given.count_rule.is_some()),
                ("extra", given.extra.is_some()),
            ],
        )?;
        if has_cursor {
            return Err(fault(
                format!("{place}.parameters"),
                "a cursor, where the answer is one object: only lists are paged",
            ));
        }
        (Shape::One, None)
    } else {
        let name = given.page_size.as_deref().ok_or_else(|| {
            fault(
                format!("{at}.page_size"),
                "a list names its page-size parameter",
            )
        })?;
        let page_size = position(name).ok_or_else(|| {
            fault(
                format!("{at}.page_size"),
                format!("{name:?} is not one of the endpoint's parameters"),
            )
        })?;
        let default = match parameters[page_size].kind {
            ParameterKind::Integer(rule) if rule.min >= 1 => rule.default,
            ParameterKind::Integer(_) => {
                return Err(fault(
                    format!("{at}.page_size"),
                    format!("{name:?} allows 0: a page size is at least 1"),
                ))
            }
            _ => {
                return Err(fault(
                    format!("{at}.page_size"),
                    format!("{name:?} is not an integer parameter"),
                ))
            }
        };
        let count_rule = match (given.count_rule, given.extra) {
            (Some(model::CountRule::Exact), None) => CountRule::Exact,
            (Some(model::CountRule::AtMost), Some(extra)) => CountRule::AtMost { extra },
            (Some(model::CountRule::Exact), Some(_)) => {
                return Err(fault(
                    format!("{at}.extra"),
                    "only with count_rule = \"at_most\"",
                ))
            }
            (Some(model::CountRule::AtMost), None) => return Err(fault(
                format!("{at}.extra"),
                "count_rule = \"at_most\" says how many items beyond the page size a page may hold",
            )),
            (None, _) => {
                return Err(fault(
                    format!("{at}.count_rule"),
                    "a list has a count_rule, \"exact\" or \"at_most\"",
                ))
            }
        };
        if !has_cursor {
            return Err(fault(
                format!("{place}.parameters"),
                "no cursor, where the answer is a list: a list is paged",
            ));
        }
        (
            Shape::List {
                page_size,
                count_rule,
            },
            Some(default),
        )
    };

    if raw.cache_ttl_s > MAX_CACHE_TTL_S {
        return Err(fault(
            format!("{place}.cache_ttl_s"),
            format!("{} is more than a year", raw.cache_ttl_s),
        ));
    }

    let answer = Answer { object, shape };
    let at = format!("{place}.example");
    let text = raw.example.trim().to_owned();
    let value: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| fault(at.clone(), format!("not JSON: {e}")))?;
    answer
        .check(&value, example_page_size)
        .map_err(|e| fault(at.clone(), format!("not an answer of this endpoint: {e}")))?;
    let example = RawValue::from_string(text).map_err(|e| fault(at, format!("not JSON: {e}")))?;

    Ok(Endpoint {
        name: raw.name,
        summary: raw.summary,
        description: raw.description,
        operation_id: raw.operation_id,
        parameters,
        subject,
        answer,
        cache_ttl_s: raw.cache_ttl_s,
        cost: raw.cost,
        example,
        not_found: raw.not_found.unwrap_or(true),
        links: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_of_the_first_major_are_read() {
        let v = |text: &str| check_version(Some(toml::Value::String(text.into())));
        assert_eq!(v("1.0").ok().as_deref(), Some("1.0"));
        assert_eq!(v("1.12").ok().as_deref(), Some("1.12"));
        for later in ["2.0", "0.9", "10.0"] {
            let f = v(later).err().unwrap();
            assert_eq!(f.place, "version");
            assert!(
                f.reason.contains("this build reads versions 1.x"),
                "{}",
                f.reason
            );
        }
        for malformed in ["1", "1.", ".0", "1.0.0", "v1.0", "1.x", "", "+1.0"] {
            let f = v(malformed).err().unwrap();
            assert!(
                f.reason.contains("is not a version"),
                "{malformed}: {}",
                f.reason
            );
        }
        assert!(check_version(None)
            .err()
            .unwrap()
            .reason
            .starts_with("missing"));
        let number = check_version(Some(toml::Value::Float(1.0))).err().unwrap();
        assert!(number.reason.starts_with("must be a string"));
    }

    #[test]
    fn names_start_with_a_letter() {
        for good in ["a", "shortvideo", "photo-grid", "x2"] {
            assert!(well_formed(good, b'-'), "{good}");
        }
        for good in ["profile", "media_count", "v2_list"] {
            assert!(well_formed(good, b'_'), "{good}");
        }
        for bad in [
            "",
            "2x",
            "-a",
            "Photo",
            "a b",
            "a/b",
            "a.b",
            "é",
            &"a".repeat(65),
        ] {
            assert!(!well_formed(bad, b'-') && !well_formed(bad, b'_'), "{bad}");
        }
        assert!(!well_formed("a_b", b'-'));
        assert!(!well_formed("a-b", b'_'));
    }

    #[test]
    fn patterns_match_whole_values() {
        let p = pattern("p".into(), "[a-z]+").ok().unwrap();
        assert!(p.matches("abc"));
        assert!(!p.matches("abc1"));
        assert!(!p.matches("1abc"));
        assert!(!p.matches("abc\n"));
        // An alternation is anchored as a whole.
        let p = pattern("p".into(), "a|b").ok().unwrap();
        assert!(p.matches("a") && p.matches("b") && !p.matches("ab"));
        // A source that would break out of the anchoring group is refused.
        assert!(pattern("p".into(), "a)|(b").is_err());
    }
}
