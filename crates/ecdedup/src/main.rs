fn main() {
    std::process::exit(ecdedup::cli::main());
}
