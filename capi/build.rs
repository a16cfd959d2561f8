//! Gives the shared library its soname, so programs linked against
//! `libspate.so` record `libspate.so.0`.

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libspate.so.0");
}
