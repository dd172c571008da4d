//! Descriptors a caller left open never reach the sandbox: every descriptor from 3 up is
//! marked close-on-exec, so the next program executed starts with 0, 1 and 2 only (plus
//! what sandgate passes by name, opened after this). An inherited directory descriptor
//! would otherwise give the command the whole host filesystem (runc's CVE-2024-21626
//! class), an inherited socket a way around the network policy.
//!
//! `sandgate run`, `sandgate mcp` and the Jupyter launcher call [`cloexec_from_3`] first
//! thing; `sandbox-init` and `sandbox-exec` again inside the sandbox, right before the
//! command. On Linux with `close_range(2)`; elsewhere (macOS, under the seatbelt backend)
//! and on older kernels one descriptor at a time, as the system lists them ([`OPEN_FDS`]).
//!
//! The one way a descriptor reaches bwrap on purpose is [`inherit_in_child`]: a bind source
//! `sandgate run` opened ([`crate::run`]'s `sources`), close-on-exec until the child of the
//! fork that becomes bwrap clears the flag, so no other program started meanwhile gets it.

/// `CLOSE_RANGE_CLOEXEC` (linux/close_range.h, Linux 5.11).
#[cfg(target_os = "linux")]
const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;

/// The directory that lists this process's open descriptors: Linux's procfs, macOS's and
/// the BSDs' fdescfs.
const OPEN_FDS: &str = if cfg!(target_os = "linux") {
    "/proc/self/fd"
} else {
    "/dev/fd"
};

/// Marks every descriptor from 3 up close-on-exec. Fails only when neither `close_range`
/// nor [`OPEN_FDS`] can be used; the caller then must not start anything.
pub fn cloexec_from_3() -> Result<(), String> {
    #[cfg(target_os = "linux")]
    if close_range_cloexec() {
        return Ok(());
    }
    each_by_name()
}

/// Before Linux 5.11, and on other systems: each open descriptor from 3 up, by name.
fn each_by_name() -> Result<(), String> {
    let entries =
        std::fs::read_dir(OPEN_FDS).map_err(|e| format!("cannot list this process's descriptors: {e}"))?;
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

/// `close_range(3, ~0, CLOSE_RANGE_CLOEXEC)`; false where the kernel has no such call.
#[cfg(target_os = "linux")]
pub(crate) fn close_range_cloexec() -> bool {
    // close_range(2) with CLOSE_RANGE_CLOEXEC closes nothing: it sets FD_CLOEXEC on every
    // open descriptor in the range. It takes no pointers and invalidates no descriptor Rust
    // code holds, so no memory or I/O safety can be broken by it.
    #[expect(
        unsafe_code,
        reason = "close_range(2) has no wrapper in std, nix or rustix; see above"
    )]
    let done = unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, CLOSE_RANGE_CLOEXEC) };
    done == 0
}

/// Clears close-on-exec on `fds` in the child of `command`'s fork, just before its execve,
/// and nowhere else: the parent's descriptors stay close-on-exec, so a program another
/// thread starts meanwhile inherits none of them.
pub(crate) fn inherit_in_child(command: &mut std::process::Command, fds: Vec<std::os::fd::RawFd>) {
    let clear = move || {
        for &fd in &fds {
            // fcntl(F_SETFD, 0) on a descriptor number the parent holds open until the
            // spawn returns: async-signal-safe, no pointers, no allocation.
            #[expect(unsafe_code, reason = "fcntl on a raw descriptor number; see above")]
            let done = unsafe { libc::fcntl(fd, libc::F_SETFD, 0) };
            if done < 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(())
    };
    // Between fork and execve the closure only makes the system calls above on a vector
    // made before the fork, as `pre_exec` requires.
    #[expect(unsafe_code, reason = "pre_exec with an async-signal-safe closure; see above")]
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(command, clear);
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;

    use nix::fcntl::{FcntlArg, FdFlag, fcntl};

    #[test]
    fn the_descriptor_by_descriptor_way_marks_an_inherited_descriptor() {
        // The way macOS takes (and Linux before 5.11): a descriptor opened without
        // close-on-exec, as a caller would leave one, comes out marked.
        let file = tempfile::tempfile().unwrap();
        fcntl(&file, FcntlArg::F_SETFD(FdFlag::empty())).unwrap();
        assert!(file.as_raw_fd() >= 3);
        super::each_by_name().unwrap();
        let flags = FdFlag::from_bits_truncate(fcntl(&file, FcntlArg::F_GETFD).unwrap());
        assert!(flags.contains(FdFlag::FD_CLOEXEC));
    }

    #[test]
    fn a_descriptor_handed_on_reaches_the_child_and_stays_close_on_exec_here() {
        let file = tempfile::tempfile().unwrap();
        let fd = file.as_raw_fd();
        let ours = std::fs::read_link(format!("/proc/self/fd/{fd}")).unwrap();
        let seen = |hand_on: bool| {
            let mut cmd = std::process::Command::new("readlink");
            cmd.arg(format!("/proc/self/fd/{fd}"));
            if hand_on {
                super::inherit_in_child(&mut cmd, vec![fd]);
            }
            let out = cmd.output().unwrap();
            String::from_utf8_lossy(&out.stdout).trim_end().to_owned()
        };
        assert_eq!(seen(true), ours.to_string_lossy());
        assert_ne!(seen(false), ours.to_string_lossy());
        let flags = FdFlag::from_bits_truncate(fcntl(&file, FcntlArg::F_GETFD).unwrap());
        assert!(flags.contains(FdFlag::FD_CLOEXEC));
    }
}
