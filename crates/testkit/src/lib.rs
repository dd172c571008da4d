//! Test fixtures for sandgate's integration tests. Never a dependency of the product.
//!
//! Everything binds loopback port 0: a DNS server that answers exactly what the test says and
//! counts the questions ([`dns`]), HTTP and HTTPS origins that echo what they received
//! ([`origin`]), a test CA made with rcgen ([`tls`]), a raw TCP echo server ([`echo`]), and
//! real PostgreSQL on a Unix socket with a database per test ([`pg`]).

#![expect(
    clippy::expect_used,
    clippy::indexing_slicing,
    reason = "test fixtures fail loudly on setup errors"
)]

pub mod dns;
pub mod echo;
pub mod origin;
pub mod pg;
pub mod tls;
