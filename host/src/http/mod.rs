//! The routes, above the server that accepts connections and serves them
//! with these ([`crate::server`]). Public: what a head hyper read may
//! still get wrong ([`head`]), the checks every request passes in order
//! ([`api`]), whether its answer comes from the cache or the chain
//! ([`answer`]), and how an answer is represented ([`encoding`]: codings
//! and entity tags; [`cors`]: browsers), and the API document
//! ([`openapi`]). Operators': the [`admin`]
//! listener.

pub mod admin;
pub mod answer;
pub mod api;
pub mod encoding;
pub mod head;
pub mod openapi;

// What the routes build their answers with, from the server below them.
pub use crate::server::{cors, request_id, response};
