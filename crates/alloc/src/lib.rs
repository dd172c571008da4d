//! The `sandgate` binary's global allocator: mimalloc for `sandgate proxy`, the system's
//! (glibc's) for every other command. Chosen once, before the first allocation, and never
//! changed, so every block is freed by the allocator that made it.
//!
//! Why mimalloc for the proxy, a long-running server making a few small allocations per
//! request and holding a few per tunnel: it gives tokio's 128-byte-aligned socket
//! registrations their own pages, where glibc pads each aligned block by over-allocating
//! (with the two options below, 1.9-2.0 KB per idle tunnel against glibc's 2.4); in the
//! interleaved runs of docs/benchmarks.md a new tunnel cost a tenth less CPU (a GET, no
//! difference within the noise) and a central carried more. Why the system's for every other
//! command: their start counts (`run` and `sandbox-init` are paid on every sandboxed command),
//! and mimalloc's arena (1 GiB reserved, committed as used) would be set up for each. So the
//! proxies that `run`, `mcp` and `jupyter` start inside their own process stay on glibc's, at
//! its 2.4 KB per tunnel. mimalloc's own start (its C constructor: a few system calls and a
//! 2.3 MiB page map reserved) runs in every process of this binary all the same, about
//! 0.1 ms; `MIMALLOC_*` variables act on it in every command (`MIMALLOC_VERBOSE` prints its
//! option table to stderr, in text, whatever `--log-format` says; `MIMALLOC_RESERVE_OS_MEMORY`
//! reserves that memory). `sandgate-init`, the sandbox's PID 1, is a binary of its own and
//! does not link mimalloc at all.
//!
//! No secure mode (`MI_SECURE`: guard pages, encoded free lists, a double-free check, about a
//! tenth slower). The proxy's blocks lose glibc's own heap checks (the tcache's double-free
//! key, safe-linking), which catch some corruption by unsafe code after the fact; the unsafe
//! code here is in dependencies (tokio, bytes, h2, rustls, hickory), the proxy and policy
//! crates forbid it. The C code linked in (ring, SQLite) allocates through glibc's `malloc`,
//! which mimalloc does not replace, and keeps those checks.
//!
//! The two options, set before mimalloc's first allocation (they win over `MIMALLOC_*`):
//! - `arena_eager_commit = 0`: an arena's memory is committed as it is used. On Linux with
//!   overcommit mimalloc commits its first 1 GiB arena at once, which cost 8 MiB of RSS at the
//!   proxy's start;
//! - `purge_delay = 0`: memory freed back to the arena (a burst of tunnel set-ups) is returned
//!   to the kernel at once instead of after 1 s. mimalloc purges only when it next allocates or
//!   frees, so with a delay an idle proxy kept the burst's memory resident.
//!
//! `sandgate proxy --allocator system` (or `SANDGATE_ALLOCATOR=system`) keeps glibc's allocator
//! for the proxy too: for a heap profiler such as heaptrack, or glibc's `GLIBC_TUNABLES`. clap
//! refuses any other name than `mimalloc` and `system` (exit 64).
//!
//! The choice is made by a constructor in `.init_array`, which glibc calls before `main` with
//! `argc`, `argv` and the environment (a glibc extension; elsewhere, musl or macOS, no
//! constructor is installed and the system allocator serves every command). It chooses
//! mimalloc only if no allocation has been made yet; an allocation before it (none is made
//! today) fixes the system's. The command word is found as clap finds it for a command line
//! that runs the proxy: the first argument, past the one global option (`--log-format FORMAT`
//! or `--log-format=FORMAT`); anything else first (`--help`, `--`) is not the proxy. The flag
//! wins over the variable, and an empty value means the default, as the binary's parser reads
//! them.
//!
//! Not here: the proxy's own memory limits (crates/proxy's connection and tunnel limits).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU8, Ordering};

use mimalloc::MiMalloc;

/// The global allocator of the `sandgate` binary (`#[global_allocator]` in its `main.rs`).
#[derive(Debug)]
pub struct ByCommand;

const UNDECIDED: u8 = 0;
const SYSTEM: u8 = 1;
const MIMALLOC: u8 = 2;

/// UNDECIDED until the constructor chooses mimalloc or the first allocation is made, whichever
/// comes first; then fixed.
static CHOSEN: AtomicU8 = AtomicU8::new(UNDECIDED);

/// mimalloc's option numbers (`mi_option_e` in mimalloc 3's `mimalloc.h`; the Rust binding
/// names neither). The unit test below checks each against the environment variable mimalloc
/// reads for it.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MI_OPTION_ARENA_EAGER_COMMIT: libmimalloc_sys::mi_option_t = 4;
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Which allocator serves this process: `"mimalloc"` or `"system"` (the proxy logs it).
pub fn chosen() -> &'static str {
    match CHOSEN.load(Ordering::Relaxed) {
        MIMALLOC => "mimalloc",
        _ => "system",
    }
}

/// What a command line asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum Asked<'a> {
    /// Not the proxy: the system's allocator.
    Other,
    /// The proxy, with the value of its `--allocator` flag if given.
    Proxy(Option<&'a [u8]>),
}

/// Reads a command line: is it the proxy (its first argument past `--log-format` and its
/// value is `proxy`), and what does its `--allocator` flag say.
pub fn asked<'a>(args: impl IntoIterator<Item = &'a [u8]>) -> Asked<'a> {
    let mut args = args.into_iter().skip(1);
    loop {
        match args.next() {
            Some(b"--log-format") => {
                args.next();
            }
            Some(arg) if arg.starts_with(b"--log-format=") => {}
            Some(b"proxy") => break,
            _ => return Asked::Other,
        }
    }
    while let Some(arg) = args.next() {
        if arg == b"--allocator" {
            return Asked::Proxy(args.next());
        }
        if let Some(value) = arg.strip_prefix(b"--allocator=") {
            return Asked::Proxy(Some(value));
        }
    }
    Asked::Proxy(None)
}

/// `SANDGATE_ALLOCATOR`'s value in `environment` (its first entry, as `getenv` reads it).
pub fn from_environment<'a>(environment: impl IntoIterator<Item = &'a [u8]>) -> Option<&'a [u8]> {
    environment
        .into_iter()
        .find_map(|var| var.strip_prefix(b"SANDGATE_ALLOCATOR="))
}

/// Whether mimalloc serves the proxy: unless its flag or, without the flag, the environment
/// says `system` (clap refuses any other name than `mimalloc` and `system`, and reads an
/// empty value as the default, as the binary's `--allocator` parser does).
pub fn wants_mimalloc(flag: Option<&[u8]>, environment: Option<&[u8]>) -> bool {
    flag.or(environment) != Some(b"system")
}

#[inline]
fn mimalloc() -> bool {
    match CHOSEN.load(Ordering::Relaxed) {
        MIMALLOC => true,
        SYSTEM => false,
        _ => {
            // The first allocation, before any constructor chose: the system's, for good.
            CHOSEN.store(SYSTEM, Ordering::Relaxed);
            false
        }
    }
}

#[expect(
    unsafe_code,
    reason = "a global allocator is an unsafe impl; each method passes its \
    caller's contract on to the allocator fixed before the first allocation, so a block is \
    always freed or resized by the allocator that made it"
)]
// SAFETY: see the reason above; `MiMalloc` and `System` each uphold `GlobalAlloc`'s contract.
unsafe impl GlobalAlloc for ByCommand {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if mimalloc() {
            unsafe { MiMalloc.alloc(layout) }
        } else {
            unsafe { System.alloc(layout) }
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if mimalloc() {
            unsafe { MiMalloc.alloc_zeroed(layout) }
        } else {
            unsafe { System.alloc_zeroed(layout) }
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if mimalloc() {
            unsafe { MiMalloc.dealloc(ptr, layout) }
        } else {
            unsafe { System.dealloc(ptr, layout) }
        }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if mimalloc() {
            unsafe { MiMalloc.realloc(ptr, layout, new_size) }
        } else {
            unsafe { System.realloc(ptr, layout, new_size) }
        }
    }
}

/// A constructor's signature under glibc: `argc`, `argv` and `envp`, as `main` gets them.
#[cfg(all(target_os = "linux", target_env = "gnu", not(test)))]
type Constructor =
    unsafe extern "C" fn(std::ffi::c_int, *const *const std::ffi::c_char, *const *const std::ffi::c_char);

/// Run by glibc before `main` (and before constructors without a priority), with the
/// process's `argc`, `argv` and `envp`, as the standard library's own argument capture is.
/// Not in this crate's unit-test binary, whose own command line could name `proxy`.
#[cfg(all(target_os = "linux", target_env = "gnu", not(test)))]
#[expect(
    unsafe_code,
    reason = "a constructor must be placed in .init_array by hand, and the \
    section name is unchecked by the compiler"
)]
#[used]
#[unsafe(link_section = ".init_array.00099")]
static CHOOSE: Constructor = choose;

/// Chooses mimalloc for the proxy's command line, unless the environment asks for the
/// system's or something was allocated already.
///
/// # Safety
///
/// `argv` must hold `argc` pointers to NUL-terminated strings, and `envp` be null or a
/// null-terminated array of them, all living for the call: what glibc passes to a constructor.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[expect(
    unsafe_code,
    reason = "reads the argv and envp glibc passes to .init_array functions and calls \
    mimalloc's option setter before any allocation"
)]
unsafe extern "C" fn choose(
    argc: std::ffi::c_int,
    argv: *const *const std::ffi::c_char,
    envp: *const *const std::ffi::c_char,
) {
    if argv.is_null() {
        return;
    }
    let count = usize::try_from(argc).unwrap_or(0);
    // SAFETY: `count` valid pointers to NUL-terminated strings (this function's contract).
    // Nothing here allocates.
    let args = (0..count).map(|i| unsafe { std::ffi::CStr::from_ptr(*argv.add(i)) }.to_bytes());
    let Asked::Proxy(flag) = asked(args) else {
        return;
    };
    let environment = if envp.is_null() {
        None
    } else {
        // SAFETY: a null-terminated array of NUL-terminated strings (this function's
        // contract), read up to its null.
        from_environment(
            (0..)
                .map(|i| unsafe { *envp.add(i) })
                .take_while(|var| !var.is_null())
                .map(|var| unsafe { std::ffi::CStr::from_ptr(var) }.to_bytes()),
        )
    };
    if !wants_mimalloc(flag, environment) {
        return;
    }
    // Only if nothing was allocated yet: a block the system's allocator made must not reach
    // mimalloc's free.
    if CHOSEN
        .compare_exchange(UNDECIDED, MIMALLOC, Ordering::Relaxed, Ordering::Relaxed)
        .is_ok()
    {
        // SAFETY: plain setters of mimalloc's option table, callable at any time.
        unsafe {
            libmimalloc_sys::mi_option_set(MI_OPTION_ARENA_EAGER_COMMIT, 0);
            libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proxy(args: &[&str]) -> bool {
        asked(args.iter().map(|a| a.as_bytes())) != Asked::Other
    }

    #[test]
    fn only_the_proxy_command_takes_mimalloc() {
        assert!(proxy(&["sandgate", "proxy"]));
        assert!(proxy(&["sandgate", "proxy", "--listen", "127.0.0.1:0"]));
        assert!(proxy(&["sandgate", "--log-format", "json", "proxy"]));
        assert!(proxy(&["sandgate", "--log-format=json", "proxy"]));
        // A sandboxed command named proxy, an option before the command, a near name, none.
        assert!(!proxy(&["sandgate", "run", "--", "proxy"]));
        assert!(!proxy(&["sandgate", "--help", "proxy"]));
        assert!(!proxy(&["sandgate", "--", "proxy"]));
        assert!(!proxy(&["sandgate", "help", "proxy"]));
        assert!(!proxy(&["sandgate", "--log-format", "proxy"]));
        assert!(!proxy(&["sandgate", "proxyx"]));
        assert!(!proxy(&["sandgate", "check-config"]));
        assert!(!proxy(&["sandgate"]));
        assert!(!proxy(&[]));
    }

    #[test]
    fn the_flag_then_the_environment_can_keep_the_systems_allocator() {
        let flag = |args: &[&'static str]| match asked(args.iter().map(|a| a.as_bytes())) {
            Asked::Proxy(flag) => flag.map(|v| String::from_utf8_lossy(v).into_owned()),
            Asked::Other => panic!("{args:?} is the proxy"),
        };
        assert_eq!(
            flag(&["sandgate", "proxy", "--allocator", "system"]).as_deref(),
            Some("system")
        );
        assert_eq!(
            flag(&["sandgate", "proxy", "--allocator=system"]).as_deref(),
            Some("system")
        );
        assert_eq!(flag(&["sandgate", "proxy", "--allocator"]), None);
        assert_eq!(flag(&["sandgate", "proxy", "--listen", "127.0.0.1:0"]), None);
        let env = |vars: &[&'static str]| from_environment(vars.iter().map(|v| v.as_bytes()));
        assert_eq!(
            env(&["PATH=/usr/bin", "SANDGATE_ALLOCATOR=system"]),
            Some(&b"system"[..])
        );
        assert_eq!(env(&["SANDGATE_ALLOCATOR_X=system"]), None);
        assert_eq!(
            env(&["SANDGATE_ALLOCATOR=", "SANDGATE_ALLOCATOR=system"]),
            Some(&b""[..])
        );
        assert!(wants_mimalloc(None, None));
        assert!(wants_mimalloc(None, Some(b"")));
        assert!(wants_mimalloc(Some(b""), Some(b"system")));
        assert!(wants_mimalloc(None, Some(b"mimalloc")));
        assert!(!wants_mimalloc(None, Some(b"system")));
        assert!(!wants_mimalloc(Some(b"system"), Some(b"mimalloc")));
        assert!(wants_mimalloc(Some(b"mimalloc"), Some(b"system")));
    }

    /// A block the system's allocator made must never reach mimalloc's free: once the first
    /// allocation has been served (here, the call `ByCommand` makes on each one; it is not
    /// this test binary's allocator), the constructor keeps the system's even for the proxy's
    /// command line.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn after_the_first_allocation_the_choice_is_fixed() {
        let _ = mimalloc();
        let args = [c"sandgate".as_ptr(), c"proxy".as_ptr()];
        // SAFETY: two NUL-terminated strings, no environment.
        #[expect(unsafe_code, reason = "calls the constructor as glibc would")]
        unsafe {
            choose(2, args.as_ptr(), std::ptr::null())
        };
        assert_eq!(chosen(), "system");
    }

    /// The option numbers are mimalloc's: a child of this test binary, started with the two
    /// environment variables mimalloc reads at its start, reads the options by our numbers.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn the_option_numbers_are_mimallocs() {
        const PROBE: &str = "SANDGATE_ALLOC_OPTION_PROBE";
        if std::env::var_os(PROBE).is_some() {
            // SAFETY: plain getters of mimalloc's option table.
            #[expect(unsafe_code, reason = "reads mimalloc's options through its C API")]
            let (commit, delay) = unsafe {
                (
                    libmimalloc_sys::mi_option_get(MI_OPTION_ARENA_EAGER_COMMIT),
                    libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY),
                )
            };
            println!("options: arena_eager_commit={commit} purge_delay={delay}");
            return;
        }
        let out = std::process::Command::new(std::env::current_exe().unwrap_or_default())
            .args([
                "--exact",
                "tests::the_option_numbers_are_mimallocs",
                "--nocapture",
            ])
            .env(PROBE, "1")
            .env("MIMALLOC_ARENA_EAGER_COMMIT", "3")
            .env("MIMALLOC_PURGE_DELAY", "1234")
            .output();
        let text = out
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        assert!(
            text.contains("options: arena_eager_commit=3 purge_delay=1234"),
            "the child said: {text}"
        );
    }
}
