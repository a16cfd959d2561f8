//! What libspate-preload (the `preload/` crate, `spate-run`) needs of
//! libspate beyond the C calls: the stack built and started from the
//! tools' flags in one step, and a program's own UDP socket made a spate
//! socket under the descriptor number the program holds.

use crate::global;
use crate::socket::CSocket;

pub use crate::syscalls::set_errno;

/// Builds the stack from the tools' flags (`args[0]` ignored) and starts
/// its polling lcores: `spate_init` and `spate_start`.
pub fn start(args: Vec<String>) -> Result<(), i32> {
    global::init(args)?;
    global::start()
}

/// Makes descriptor `fd` a new unbound spate socket of the family
/// (IPv6 if `v6`), non-blocking if `nonblocking`: an event descriptor
/// takes the number (what was there, a kernel socket, is closed), as
/// `spate_socket`'s own descriptor is.
pub fn adopt(fd: i32, v6: bool, nonblocking: bool, cloexec: bool) -> Result<(), i32> {
    global::stack()?;
    let s = CSocket::at(fd, v6, cloexec)?;
    if nonblocking {
        s.set_nonblocking(true)?;
    }
    global::insert(s);
    Ok(())
}
