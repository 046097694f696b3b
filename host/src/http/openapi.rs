//! `GET /v1/openapi.json`: the API document of what this configuration
//! serves, made by [`platform_description::openapi::document`] from the
//! host's base (`openapi/base.json`: its own paths and shared components,
//! naming no platform) and the live platforms' descriptions. It is made
//! with each snapshot (at start, by `socialgate check`, at every reload),
//! so a name two platforms would both take refuses the configuration
//! before anything serves it, and the document follows a reload. Its keys
//! come out sorted (serde_json keeps maps ordered by key): the same bytes,
//! so the same `ETag`, for the same descriptions.

use std::collections::BTreeMap;

use bytes::Bytes;
use hyper::header::{HeaderMap, HeaderValue, CACHE_CONTROL, ETAG};
use hyper::{Response, StatusCode};
use platform_description::openapi::{self, DocumentError};
use platform_description::Description;

use super::encoding::{self, NotModified};
use super::response::{self, Body};
use crate::routing::config::{PlatformConfig, PlatformStatus};

/// The service's own part of the document: platform-free, so compiled in.
const BASE: &str = include_str!("../../../openapi/base.json");
/// The document changes at a reload: caches keep it, and revalidate it
/// with its `ETag` before each use.
const CACHE: &str = "no-cache";

/// Why the configuration's document cannot be made.
#[derive(Debug, thiserror::Error)]
pub enum ApiDocumentError {
    #[error(
        "the API document (GET /v1/openapi.json) cannot be made from the live platforms' \
         descriptions: {0}; give the platform another `openapi_prefix`, or the name its own \
         `openapi_name` or `operation_id` (docs/platforms.md, \"The API document\")"
    )]
    Names(#[source] DocumentError),
    #[error("the API document's base (openapi/base.json) {0}")]
    Base(String),
}

/// The document as served: its bytes and their tag, made once.
#[derive(Debug)]
pub struct ApiDocument {
    body: Bytes,
    tag: HeaderValue,
}

impl ApiDocument {
    /// The document of the live platforms among `platforms`, in name order.
    pub fn build(platforms: &BTreeMap<String, PlatformConfig>) -> Result<Self, ApiDocumentError> {
        let base = serde_json::from_str(BASE).map_err(|e| ApiDocumentError::Base(e.to_string()))?;
        let live: Vec<&Description> = platforms
            .values()
            .filter(|platform| platform.status == PlatformStatus::Live)
            .filter_map(|platform| platform.description.as_ref())
            .map(|described| &*described.description)
            .collect();
        let document = openapi::document(base, &live).map_err(|e| match e {
            DocumentError::Base(what) => ApiDocumentError::Base(what),
            e => ApiDocumentError::Names(e),
        })?;
        let body = Bytes::from(
            serde_json::to_vec(&document)
                .map_err(|e| ApiDocumentError::Base(format!("cannot be written as JSON: {e}")))?,
        );
        let tag = encoding::etag(&[&body]);
        Ok(ApiDocument { body, tag })
    }

    /// The document, with its `ETag`; `304` when `If-None-Match` matches
    /// it. Compressed, when asked, by [`encoding::represent`] as every
    /// answer is.
    pub fn answer(&self, request: &HeaderMap) -> Response<Body> {
        let mut response = response::json_response(StatusCode::OK, self.body.clone());
        let headers = response.headers_mut();
        headers.insert(ETAG, self.tag.clone());
        headers.insert(CACHE_CONTROL, HeaderValue::from_static(CACHE));
        if encoding::not_modified(request, &self.tag) {
            response.extensions_mut().insert(NotModified);
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What is compiled in is the service's own: it names none of the
    /// platforms the repository describes, and it is a document alone.
    #[test]
    fn the_base_names_no_platform_and_serves_alone() {
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
        for dir in ["platforms", "platform-description/tests/fixtures"] {
            for entry in std::fs::read_dir(format!("{root}/{dir}")).unwrap() {
                let path = entry.unwrap().path();
                if path.extension().is_some_and(|e| e == "toml") {
                    let name = path.file_stem().unwrap().to_str().unwrap();
                    assert!(!BASE.contains(name), "the base names {name}");
                }
            }
        }
        let document = ApiDocument::build(&BTreeMap::new()).unwrap();
        let value: serde_json::Value = serde_json::from_slice(&document.body).unwrap();
        assert_eq!(value["openapi"], "3.1.0");
        assert!(value.get(openapi::TEMPLATE_KEY).is_none());
        assert_eq!(document.tag, encoding::etag(&[&document.body]));
    }
}
