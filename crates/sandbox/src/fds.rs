//! Descriptors a caller left open never reach the sandbox: every descriptor from 3 up is
//! marked close-on-exec, so the next program executed starts with 0, 1 and 2 only (plus
//! what sandgate passes by name, opened after this). An inherited directory descriptor
//! would otherwise give the command the whole host filesystem (runc's CVE-2024-21626
//! class), an inherited socket a way around the network policy.
//!
//! `sandgate run`, `sandgate mcp` and the Jupyter launcher call [`cloexec_from_3`] first
//! thing; `sandbox-init` and `sandbox-exec` again inside the sandbox, right before the
//! command.

/// `CLOSE_RANGE_CLOEXEC` (linux/close_range.h, Linux 5.11).
const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;

/// Marks every descriptor from 3 up close-on-exec. Fails only when neither `close_range`
/// nor `/proc/self/fd` can be used; the caller then must not start anything.
pub fn cloexec_from_3() -> Result<(), String> {
    // close_range(2) with CLOSE_RANGE_CLOEXEC closes nothing: it sets FD_CLOEXEC on every
    // open descriptor in the range. It takes no pointers and invalidates no descriptor Rust
    // code holds, so no memory or I/O safety can be broken by it.
    #[expect(
        unsafe_code,
        reason = "close_range(2) has no wrapper in std, nix or rustix; see above"
    )]
    let done = unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, CLOSE_RANGE_CLOEXEC) };
    if done == 0 {
        return Ok(());
    }
    // Before Linux 5.11: each open descriptor by name.
    let entries = std::fs::read_dir("/proc/self/fd")
        .map_err(|e| format!("cannot list this process's descriptors: {e}"))?;
    let fds: Vec<i32> = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|&fd| fd >= 3)
        .collect();
    for fd in fds {
        // fcntl(F_SETFD) on a descriptor number: no pointers, and on a descriptor that
        // closed meanwhile (the directory listing's own) it fails with EBADF, harmlessly.
        #[expect(unsafe_code, reason = "fcntl on a raw descriptor number; see above")]
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
        if flags >= 0 {
            #[expect(unsafe_code, reason = "fcntl on a raw descriptor number; see above")]
            let _ = unsafe { libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC) };
        }
    }
    Ok(())
}
