//! The `sandgate` binary's global allocator: mimalloc for `sandgate proxy`, the system's
//! (glibc's) for every other command. Chosen once, before the first allocation, and never
//! changed, so every block is freed by the allocator that made it.
//!
//! Why two: the proxy is a long-running server making a few small allocations per request and
//! holding a few per tunnel. There mimalloc costs less CPU per request than glibc (about an
//! eighth less per keep-alive GET in docs/benchmarks.md) and no alignment padding for tokio's
//! 128-byte-aligned socket registrations, which glibc pads by over-allocating: with the two
//! options below, 1.9 KB per idle tunnel against glibc's 2.4. Every other command (`run`,
//! `sandbox-init`, `mcp`, `jupyter`, `doctor`...) is short or light, and there mimalloc's
//! start (0.2 to 0.3 ms per process even with eager commit off) would be paid on every
//! sandboxed command. `sandgate-init`, the sandbox's PID 1, is a binary of its own and keeps
//! the system's.
//!
//! The two options, set before mimalloc's first allocation:
//! - `arena_eager_commit = 0`: an arena's memory is committed as it is used. On Linux with
//!   overcommit mimalloc commits its first 1 GiB arena at once, which cost 7 MiB of RSS at the
//!   proxy's start and 0.6 ms per process;
//! - `purge_delay = 0`: memory freed back to the arena (a burst of tunnel set-ups) is returned
//!   to the kernel at once instead of after 1 s. An idle proxy runs no allocator code that would
//!   purge later, so with the delay the burst's memory stayed resident.
//!
//! The choice is made by a constructor in `.init_array`, which glibc calls before `main` with
//! `argc` and `argv` (a glibc extension; elsewhere, musl or macOS, no constructor is installed
//! and the system allocator serves every command). It chooses mimalloc only if no allocation
//! has been made yet; an allocation before it (none is made today) fixes the system's. The
//! command word is read as clap reads it: the first argument that is not an option, past the
//! one global option that takes a value (`--log-format FORMAT`).
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
const MI_OPTION_ARENA_EAGER_COMMIT: libmimalloc_sys::mi_option_t = 4;
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Which allocator serves this process: `"mimalloc"` or `"system"` (the proxy logs it).
pub fn chosen() -> &'static str {
    match CHOSEN.load(Ordering::Relaxed) {
        MIMALLOC => "mimalloc",
        _ => "system",
    }
}

/// Whether this command line runs the proxy: its first argument that is not an option (past
/// `--log-format`'s value) is `proxy`.
pub fn runs_proxy<'a>(args: impl IntoIterator<Item = &'a [u8]>) -> bool {
    let mut args = args.into_iter().skip(1);
    while let Some(arg) = args.next() {
        if arg == b"--log-format" {
            args.next();
        } else if arg.starts_with(b"--log-format=") {
            continue;
        } else {
            return arg == b"proxy";
        }
    }
    false
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

/// Run by glibc before `main` (and before constructors without a priority), with the
/// process's `argc` and `argv`, as the standard library's own argument capture is.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[expect(
    unsafe_code,
    reason = "a constructor must be placed in .init_array by hand, and the \
    section name is unchecked by the compiler"
)]
#[used]
#[unsafe(link_section = ".init_array.00099")]
static CHOOSE: extern "C" fn(
    std::ffi::c_int,
    *const *const std::ffi::c_char,
    *const *const std::ffi::c_char,
) = choose;

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[expect(
    unsafe_code,
    reason = "reads the argv glibc passes to .init_array functions (argc \
    NUL-terminated strings, as for main) and calls mimalloc's option setter before any \
    allocation"
)]
extern "C" fn choose(
    argc: std::ffi::c_int,
    argv: *const *const std::ffi::c_char,
    _envp: *const *const std::ffi::c_char,
) {
    if argv.is_null() {
        return;
    }
    let count = usize::try_from(argc).unwrap_or(0);
    // SAFETY: glibc passes main's argc and argv: `count` valid pointers to NUL-terminated
    // strings that live as long as the process. Nothing here allocates.
    let args = (0..count).map(|i| unsafe { std::ffi::CStr::from_ptr(*argv.add(i)) }.to_bytes());
    if !runs_proxy(args) {
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
        runs_proxy(args.iter().map(|a| a.as_bytes()))
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
        assert!(!proxy(&["sandgate", "--log-format", "proxy"]));
        assert!(!proxy(&["sandgate", "proxyx"]));
        assert!(!proxy(&["sandgate", "check-config"]));
        assert!(!proxy(&["sandgate"]));
        assert!(!proxy(&[]));
    }

    /// A block the system's allocator made must never reach mimalloc's free: once anything is
    /// allocated (this test binary's harness has), the constructor keeps the system's even for
    /// the proxy's command line.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn after_the_first_allocation_the_choice_is_fixed() {
        let _ = mimalloc();
        let args = [c"sandgate".as_ptr(), c"proxy".as_ptr()];
        choose(2, args.as_ptr(), std::ptr::null());
        assert_eq!(chosen(), "system");
    }

    /// The option numbers are mimalloc's: a child of this test binary, started with the two
    /// environment variables mimalloc reads at its start, reads the options by our numbers.
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
