//! The secure port's accept loop: [`crate::http_server`]'s, with TLS (one home for the bounds
//! every port shares: [`MAX_CONNECTIONS`], [`HANDSHAKE_TIMEOUT`], [`HEADER_READ_TIMEOUT`]).

pub use crate::http_server::{
    HANDSHAKE_TIMEOUT, HEADER_READ_TIMEOUT, Limits, MAX_CONNECTIONS, serve_tls as serve,
};
