//! The `gpumem` command line. Everything lives in [`cli`]; the library (`gpumem::`) holds the
//! allocator, devices, tensors and the script runtime it drives.

mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}
