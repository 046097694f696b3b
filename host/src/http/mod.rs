//! The public HTTP surface: the listener ([`server`]), the checks every
//! request passes in order ([`api`]), and the JSON envelopes ([`response`]).

pub mod api;
pub mod response;
pub mod server;
