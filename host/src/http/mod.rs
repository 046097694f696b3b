//! The HTTP surfaces. Public: the listener ([`server`]), the checks every
//! request passes in order ([`api`]), request IDs ([`request_id`]) and the
//! JSON envelopes ([`response`]). Operators': the [`admin`] listener.

pub mod admin;
pub mod answer;
pub mod api;
pub mod request_id;
pub mod response;
pub mod server;
