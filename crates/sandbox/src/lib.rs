//! sandgate's sandbox runner on bubblewrap: the policy ([`policy`]), the bwrap command line
//! as a pure function of it ([`argv`]), the init that runs first inside proxied sandboxes
//! ([`init`]), and the supervisor that starts the proxy, the bridge and bwrap ([`run`]).

pub mod argv;
pub mod init;
pub mod policy;
pub mod run;
pub mod seatbelt;
