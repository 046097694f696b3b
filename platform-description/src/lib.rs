//! A platform described as data: its endpoints, their parameters and
//! rules, the objects they answer, their default cache lifetimes and costs.
//!
//! The service serves any platform a description file describes, so adding
//! one is a file and a reload, never a new build. This crate reads and
//! checks such files, and applies what they say: it validates a caller's
//! parameters for an endpoint and checks an answer's `data` against the
//! endpoint's object type. The format is documented for operators in
//! `docs/platforms.md`.
//!
//! # Layout
//!
//! - [`model`]: the serde types of a file, as written.
//! - [`load`]: reading a file and checking it into a [`Description`],
//!   refusing it with the file, the place and the reason ([`LoadError`]).
//! - [`description`]: the checked [`Description`] and its parts, which
//!   only [`load`] can make.
//! - [`params`]: a caller's query parameters checked for an [`Endpoint`]
//!   ([`Endpoint::validate`], [`ParamError`]).
//! - [`answer`]: an answer's `data` checked against an [`Endpoint`]
//!   ([`Endpoint::check_answer`], [`AnswerError`]).
//! - [`openapi`]: the API document of the live platforms, from a base
//!   document and their descriptions ([`openapi::document`]).
//!
//! # Example
//!
//! ```
//! use platform_description::Description;
//! use std::path::Path;
//!
//! let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../platforms/shortvideo.toml");
//! let shortvideo = Description::load(&path, "shortvideo").unwrap();
//! let posts = shortvideo.endpoint("posts").unwrap();
//! let asked = posts.validate([("username", "@lunabakes"), ("count", "5")]).unwrap();
//! assert_eq!(asked.subject(), "lunabakes");
//! assert_eq!(asked.page_size(), Some(5));
//! let refused = posts.validate([("username", "a"), ("count", "31")]).unwrap_err();
//! assert_eq!(refused.to_string(), "parameter `count` must be an integer from 1 to 30");
//! ```

pub mod answer;
pub mod description;
pub mod load;
pub mod model;
pub mod openapi;
pub mod params;

pub use answer::{AnswerError, DataPath};
pub use description::{
    Answer, CountRule, Description, Endpoint, Field, FieldType, IntegerRule, Link, ObjectType,
    Parameter, ParameterKind, Pattern, Shape, StringField, StringRule,
};
pub use load::{LoadError, Refusal};
pub use params::{ParamError, Validated, Value};
