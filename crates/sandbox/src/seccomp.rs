//! The seccomp filter for the sandboxed command, compiled with seccompiler (rust-vmm).
//!
//! It denies what a bubblewrap sandbox leaves open (see docs/sandbox.md, "The seccomp
//! filter", for the same table): writing into the host's terminal, the host's kernel
//! keyring, new user namespaces, io_uring (whose operations would bypass the rest), and a
//! few kernel interfaces a build or an agent never needs; and it lets `socket(2)` make only
//! the families a command needs (IPv4, IPv6, routing netlink, and Unix only where the
//! policy opts in: never VSOCK, packet, Bluetooth, ...). Every other system call is
//! allowed: a deny list on top of the namespaces, not a whitelist of the command's calls.
//!
//! Every process in the sandbox runs under it: the command from the child the in-sandbox
//! init forks for it (or through `sandgate sandbox-exec` where there is no init;
//! [`crate::exec`]), and the init itself ([`crate::init`], PID 1) under the same filter,
//! with Unix sockets allowed only where it holds bridges or the policy allows them. Building the filter is pure and unit-tested
//! by running the BPF on sample system calls; loading it is [`load`].
//!
//! The filter is Linux's own (`filter`, in `seccomp/filter.rs`, compiled on Linux only).
//! Elsewhere [`load`] fails, so a step that needs the filter never runs without it: both
//! callers run inside the Linux sandbox only.

#[cfg(target_os = "linux")]
mod filter;

#[cfg(target_os = "linux")]
pub use filter::{SeccompError, program};

/// What the policy may relax in the filter.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FilterOptions {
    /// `platform.seccomp.allow_unix_sockets`: let the command create `AF_UNIX` sockets.
    pub allow_unix_sockets: bool,
}

/// The filter compiled and ready to load. Compiling allocates; [`Filter::load`] does not, so
/// a filter compiled before a fork can be loaded in the child ([`crate::exec::Confinement`]).
pub struct Filter {
    #[cfg(target_os = "linux")]
    program: seccompiler::BpfProgram,
}

impl Filter {
    /// A filter the kernel refuses to load (an empty program), to test failing closed.
    #[cfg(all(test, target_os = "linux"))]
    pub(crate) fn refused_by_the_kernel() -> Filter {
        Filter { program: Vec::new() }
    }
}

impl std::fmt::Debug for Filter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Filter")
    }
}

impl Filter {
    /// Compiles the filter for `options`. Fails where there is no seccomp (not Linux), so a
    /// step that needs the filter never runs without it.
    pub fn compile(options: FilterOptions) -> Result<Filter, String> {
        #[cfg(target_os = "linux")]
        {
            Ok(Filter {
                program: program(options).map_err(|e| e.to_string())?,
            })
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = options;
            Err(
                "seccomp filters exist on Linux only, and this step runs only inside the Linux sandbox"
                    .to_owned(),
            )
        }
    }

    /// Loads the filter into the calling thread, and so into everything it executes or
    /// starts from then on (seccompiler sets `no_new_privs` first). Allocates nothing.
    /// Fail closed: an error means the caller must not go on.
    pub fn load(&self) -> Result<(), nix::errno::Errno> {
        #[cfg(target_os = "linux")]
        {
            filter::load(&self.program)
        }
        #[cfg(not(target_os = "linux"))]
        {
            Err(nix::errno::Errno::ENOSYS)
        }
    }
}

/// Compiles the filter and loads it into the calling thread ([`Filter::load`]). Fail closed:
/// an error means the caller must not go on.
pub fn load(options: FilterOptions) -> Result<(), String> {
    Filter::compile(options)?
        .load()
        .map_err(|e| format!("cannot load the seccomp filter: {}", e.desc()))
}
