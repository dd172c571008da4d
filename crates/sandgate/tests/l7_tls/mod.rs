//! Fixtures of the HTTPS interception tests (issue 33, phase 2), in [`interception`]: a
//! proxy started with `--intercept-ca-cert` that takes a test CA for the system's roots
//! (`SSL_CERT_FILE`), a TLS client through one of its tunnels (the raw HTTP/1.1 client of
//! `l7/wire.rs` speaks inside it), and the audit lines of a tunnel and of its requests. The
//! tests are in [`sandboxed`] and [`sandboxed_python`] (inside `sandgate run`), [`spelling`],
//! [`pseudo_headers`] and [`trailing_dot`] (what a client writes inside an intercepted
//! tunnel), [`read_only`], [`preset`] (`github-read-only`), [`explain`] and [`trust`] (which
//! certificates each side sees, and failing closed).

mod explain;
pub mod interception;
mod preset;
mod pseudo_headers;
mod read_only;
mod sandboxed;
mod sandboxed_python;
mod spelling;
mod trailing_dot;
mod trust;

pub use interception::*;
