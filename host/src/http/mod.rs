//! The HTTP surfaces. Public: the
//! listener ([`server`], with [`tls`], [`refusal`] of heads hyper
//! cannot read and the time limits of HTTP/2 connections, [`h2_limits`]),
//! what a head hyper read may still get wrong ([`head`]), the checks every
//! request passes in order ([`api`]), request IDs ([`request_id`]), the
//! JSON envelopes ([`response`]), and how an answer is represented
//! ([`encoding`]: codings and entity tags; [`cors`]: browsers).
//! Operators': the [`admin`] listener.

pub mod admin;
pub mod answer;
pub mod api;
pub mod cors;
pub mod encoding;
pub mod h2_limits;
pub mod head;
pub mod refusal;
pub mod request_id;
pub mod response;
pub mod server;
pub mod tls;
