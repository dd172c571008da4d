//! Test fixtures for sandgate's integration tests. Never a dependency of the product.
//!
//! Everything binds loopback port 0: a DNS server that answers exactly what the test says and
//! counts the questions ([`dns`]), HTTP and HTTPS origins that echo what they received
//! ([`origin`]), a test CA made with rcgen ([`tls`]), a raw TCP echo server ([`echo`]),
//! real PostgreSQL on a Unix socket with a database per test ([`pg`]), and a node that
//! writes whatever the test says on one HTTP/2 stream to a central proxy ([`node`]).

#![expect(
    clippy::expect_used,
    clippy::indexing_slicing,
    reason = "test fixtures fail loudly on setup errors"
)]

pub mod dns;
pub mod echo;
pub mod node;
pub mod origin;
pub mod pg;
pub mod tls;
