use std::process::ExitCode;

#[actix_web::main]
async fn main() -> ExitCode {
    flashsale::cli::main().await
}
