//! The tar archive a stage script travels in (`PUT /containers/{id}/archive?path=/`), and the
//! demultiplexing of short log reads (`GET /containers/{id}/logs`, the service log tail of a
//! health-check warning). Stage output itself never passes through here: the host streams it.

/// A tar holding `.runway/` (0755) and `.runway/script` (0644) with `script`.
pub fn script_archive(script: &[u8]) -> Result<Vec<u8>, String> {
    let mut builder = tar::Builder::new(Vec::new());
    let mut dir = tar::Header::new_gnu();
    dir.set_entry_type(tar::EntryType::Directory);
    dir.set_mode(0o755);
    dir.set_size(0);
    dir.set_cksum();
    builder
        .append_data(&mut dir, ".runway/", std::io::empty())
        .map_err(|e| format!("building the script archive: {e}"))?;
    let mut file = tar::Header::new_gnu();
    file.set_entry_type(tar::EntryType::Regular);
    file.set_mode(0o644);
    file.set_size(script.len() as u64);
    file.set_cksum();
    builder
        .append_data(&mut file, ".runway/script", script)
        .map_err(|e| format!("building the script archive: {e}"))?;
    builder.into_inner().map_err(|e| format!("building the script archive: {e}"))
}

/// The text of a log read: Docker's multiplexed stream (8-byte frame headers: stream, 0, 0, 0,
/// big-endian length) unwrapped, or the bytes as they are when they are not framed (a TTY).
pub fn demux_logs(raw: &[u8]) -> String {
    let mut out = Vec::with_capacity(raw.len());
    let mut rest = raw;
    while !rest.is_empty() {
        let framed = rest.len() >= 8 && rest[0] <= 2 && rest[1..4] == [0, 0, 0];
        if !framed {
            return String::from_utf8_lossy(raw).into_owned();
        }
        let len = u32::from_be_bytes([rest[4], rest[5], rest[6], rest[7]]) as usize;
        let end = (8 + len).min(rest.len());
        out.extend_from_slice(&rest[8..end]);
        rest = &rest[end..];
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn archive_holds_the_script() {
        let data = script_archive(b"echo hi\n").unwrap();
        let mut archive = tar::Archive::new(data.as_slice());
        let mut entries: Vec<(String, u32, String)> = Vec::new();
        for entry in archive.entries().unwrap() {
            let mut entry = entry.unwrap();
            let mut text = String::new();
            entry.read_to_string(&mut text).unwrap();
            entries.push((entry.path().unwrap().display().to_string(), entry.header().mode().unwrap(), text));
        }
        assert_eq!(
            entries,
            vec![(".runway/".into(), 0o755, String::new()), (".runway/script".into(), 0o644, "echo hi\n".into())]
        );
    }

    #[test]
    fn demultiplexes_frames() {
        let mut raw = vec![1, 0, 0, 0, 0, 0, 0, 6];
        raw.extend_from_slice(b"hello\n");
        raw.extend_from_slice(&[2, 0, 0, 0, 0, 0, 0, 4]);
        raw.extend_from_slice(b"err\n");
        assert_eq!(demux_logs(&raw), "hello\nerr\n");
        assert_eq!(demux_logs(b"plain tty output\n"), "plain tty output\n");
        assert_eq!(demux_logs(&[1, 0, 0, 0, 0, 0, 0, 10, b'a']), "a");
        assert_eq!(demux_logs(b""), "");
    }
}
