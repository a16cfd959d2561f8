//! Finds the system DPDK with pkg-config, compiles the C shim for DPDK's
//! static-inline functions and generates the raw bindings with bindgen.

use std::env;
use std::path::PathBuf;
use std::process::Command;

const MIN_DPDK: &str = "22.11";

fn main() {
    println!("cargo:rerun-if-changed=shim/shim.h");
    println!("cargo:rerun-if-changed=shim/shim.c");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");

    let dpdk = pkg_config::Config::new().atleast_version(MIN_DPDK).probe("libdpdk").unwrap_or_else(|e| {
        panic!(
            "spate-dpdk needs DPDK >= {MIN_DPDK} visible to pkg-config as `libdpdk`.\n\
                 On Debian: apt-get install dpdk dpdk-dev libdpdk-dev pkg-config clang libclang-dev\n\
                 (or run `cargo xtask setup`, which installs them).\n\
                 pkg-config said: {e}"
        )
    });

    // rte_vdev_init lives in the vdev bus driver, which pkg-config's
    // application link line leaves to the EAL's plugin loader.
    println!("cargo:rustc-link-lib=dylib=rte_bus_vdev");
    // rte_eth_from_rings (two ports wired to each other) is the ring PMD's.
    println!("cargo:rustc-link-lib=dylib=rte_net_ring");

    // The full cflags matter: `-include rte_config.h` and the machine flags
    // DPDK was built with decide struct layouts and which inline paths exist.
    let cflags = pkg_config_cflags();

    let mut cc = cc::Build::new();
    cc.file("shim/shim.c").opt_level(3).warnings(false);
    for flag in &cflags {
        cc.flag(flag);
    }
    for path in &dpdk.include_paths {
        cc.include(path);
    }
    cc.compile("spate_dpdk_shim");

    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let bindings = bindgen::Builder::default()
        .header("shim/shim.h")
        .clang_args(&cflags)
        .clang_macro_fallback()
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()))
        .allowlist_function("spate_.*")
        .allowlist_function("rte_eal_.*")
        .allowlist_function("rte_strerror")
        .allowlist_function("rte_version")
        .allowlist_function("rte_get_tsc_hz")
        .allowlist_function("rte_get_next_lcore")
        .allowlist_function("rte_get_main_lcore")
        .allowlist_function("rte_lcore_.*")
        .allowlist_function("rte_socket_.*")
        .allowlist_function("rte_thread_register")
        .allowlist_function("rte_thread_unregister")
        .allowlist_function("rte_pktmbuf_pool_create")
        .allowlist_function("rte_pktmbuf_pool_create_by_ops")
        .allowlist_function("rte_pktmbuf_free_bulk")
        .allowlist_function("rte_pktmbuf_clone")
        .allowlist_function("rte_mempool_.*")
        .allowlist_function("rte_eth_.*")
        .allowlist_function("rte_epoll_.*")
        .allowlist_function("rte_intr_tls_epfd")
        .allowlist_type("rte_epoll_.*")
        .allowlist_function("rte_vdev_init")
        .allowlist_function("rte_vdev_uninit")
        .allowlist_function("rte_eth_from_rings")
        .allowlist_function("rte_ring_create")
        .allowlist_function("rte_ring_free")
        .allowlist_function("rte_ring_count")
        .allowlist_type("rte_mbuf")
        .allowlist_type("rte_mempool")
        .allowlist_type("rte_eth_.*")
        .allowlist_type("rte_ether_addr")
        .allowlist_var("RTE_ETH_.*")
        .allowlist_var("RTE_MBUF_F_.*")
        .allowlist_var("RTE_PTYPE_.*")
        .allowlist_var("RTE_MAX_LCORE")
        .allowlist_var("RTE_MAX_ETHPORTS")
        .allowlist_var("RTE_MBUF_DEFAULT_BUF_SIZE")
        .allowlist_var("RTE_PKTMBUF_HEADROOM")
        .allowlist_var("RTE_ETHER_ADDR_LEN")
        .allowlist_var("LCORE_ID_ANY")
        .allowlist_var("RING_F_SP_ENQ")
        .allowlist_var("RING_F_SC_DEQ")
        .allowlist_var("SOCKET_ID_ANY")
        .allowlist_var("RTE_ETHDEV_QUEUE_STAT_CNTRS")
        .allowlist_var("RTE_ETH_XSTATS_NAME_SIZE")
        .allowlist_var("RTE_MEMPOOL_.*")
        .allowlist_var("RING_F_.*")
        .blocklist_function("rte_mempool_ops_.*")
        .blocklist_function("rte_eth_dev_info_get_.*")
        .derive_default(true)
        .derive_debug(false)
        .layout_tests(false)
        .generate_comments(false)
        .prepend_enum_name(false)
        .generate()
        .expect("bindgen failed on shim/shim.h (is libclang-dev installed?)");
    bindings.write_to_file(out.join("bindings.rs")).expect("write bindings.rs");

    build_xdp_program(&out);
}

/// Builds spate's XDP program (`xdp/spate_xdp.c`) with clang's BPF target
/// into `OUT_DIR/spate_xdp.o`, which the crate embeds. Without a clang
/// that can (Debian's `clang` package can), the object is left empty and
/// a `net_af_xdp` port without an `xdp_prog=` of its own is refused at
/// start with the reason.
fn build_xdp_program(out: &std::path::Path) {
    println!("cargo:rerun-if-changed=xdp/spate_xdp.c");
    // A clang installed later is found by the next build.
    println!("cargo:rerun-if-env-changed=PATH");
    println!("cargo:rerun-if-env-changed=CLANG");
    let object = out.join("spate_xdp.o");
    let arch = env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let multiarch = format!("/usr/include/{arch}-linux-gnu");
    let clang = env::var("CLANG").unwrap_or_else(|_| "clang".into());
    // The program reads EtherTypes as they lie in the frame, in the BPF
    // target's byte order: little-endian (`bpfel`).
    let built = Command::new(&clang)
        .args(["-O2", "-g", "-Wall", "-Werror", "-target", "bpfel", "-I", &multiarch, "-c", "xdp/spate_xdp.c", "-o"])
        .arg(&object)
        .output();
    match built {
        Ok(o) if o.status.success() => {}
        // A clang that ran and failed: the program is wrong, say so.
        Ok(o) => panic!("{clang} -target bpfel xdp/spate_xdp.c failed:\n{}", String::from_utf8_lossy(&o.stderr)),
        Err(e) => {
            println!(
                "cargo:warning=spate's XDP program was not built ({clang}: {e}): net_af_xdp ports need an xdp_prog= of their own; install clang and `cargo clean -p spate-dpdk`"
            );
            std::fs::write(&object, []).expect("write an empty spate_xdp.o");
        }
    }
}

fn pkg_config_cflags() -> Vec<String> {
    let output =
        Command::new("pkg-config").args(["--cflags", "libdpdk"]).output().expect("run pkg-config --cflags libdpdk");
    assert!(output.status.success(), "pkg-config --cflags libdpdk failed: {}", String::from_utf8_lossy(&output.stderr));
    let text = String::from_utf8(output.stdout).expect("pkg-config output is UTF-8");
    // Kept in order: `-include rte_config.h` is two words that belong together.
    text.split_whitespace().map(str::to_string).collect()
}
