//! What spate asks the OS about its own process (the FFI for it lives in
//! this crate with the rest of spate's unsafe code).

/// The process's effective user id (`geteuid`): whose files it may trust.
pub fn effective_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_effective_uid_owns_what_this_process_makes() {
        use std::os::unix::fs::MetadataExt;
        let dir = std::env::temp_dir().join(format!("spate-euid-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let owner = std::fs::metadata(&dir).unwrap().uid();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(super::effective_uid(), owner);
    }
}
