//! What several modules' unit tests share.

/// A Python process that runs `setup` (with `socket` and `sys` imported), says so on its
/// stdout, and then waits until its stdin is closed: returned once it has said so, so that
/// what `setup` made (a connection, a listener) exists. Drop its stdin and wait for it.
pub(crate) fn python_until_told(setup: &str) -> std::process::Child {
    let script = format!("import socket, sys\n{setup}\nprint('in', flush=True)\nsys.stdin.read()\n");
    let mut child = std::process::Command::new("python3")
        .args(["-c", &script])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line.trim(), "in", "the helper process did not start");
    child
}
