//! Test fixtures for sandgate's integration tests. Never a dependency of the product.
//!
//! Everything binds loopback port 0: a DNS server that answers exactly what the test says and
//! counts the questions ([`dns`]), HTTP and HTTPS origins that echo what they received
//! ([`origin`]), a test CA made with rcgen ([`tls`]), a raw TCP echo server ([`echo`]),
//! real PostgreSQL on a Unix socket with a database per test ([`pg`]), a node that
//! writes whatever the test says on one HTTP/2 stream to a central proxy ([`node`]), and a
//! port that refuses connections and stays taken while the test holds it ([`closed`]).

#![expect(
    clippy::expect_used,
    clippy::indexing_slicing,
    reason = "test fixtures fail loudly on setup errors"
)]

pub mod closed;
pub mod dns;
pub mod echo;
pub mod node;
pub mod origin;
pub mod pg;
pub mod tls;
