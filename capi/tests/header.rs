//! `include/spate.h` is what cbindgen makes of the crate: this test fails
//! when they differ, and writes the header when SPATE_UPDATE_HEADER=1.

#[test]
fn spate_h_is_generated_from_the_code() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let bindings = cbindgen::Builder::new()
        .with_crate(dir)
        .with_config(config)
        .generate()
        .expect("cbindgen could not read capi/src");
    let mut made = Vec::new();
    bindings.write(&mut made);
    let made = String::from_utf8(made).expect("the header is UTF-8");
    let path = dir.join("include/spate.h");
    if std::env::var_os("SPATE_UPDATE_HEADER").is_some() {
        std::fs::write(&path, &made).expect("write include/spate.h");
    }
    let kept = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        kept == made,
        "capi/include/spate.h differs from the code: run `SPATE_UPDATE_HEADER=1 cargo test -p spate-capi --test header` and commit it"
    );
    for call in ["spate_init", "spate_socket", "spate_recvmmsg", "spate_sendmmsg", "spate_setsockopt", "spate_poll_fd"]
    {
        assert!(made.contains(&format!(" {call}(")), "{call} is not in the header");
    }
}
