//! The shop served inside the calling process on a port the OS picked, as
//! the tests and the benchmark run it.

use actix_web::dev::ServerHandle;

use crate::config::Settings;
use crate::services::Shop;
use crate::startup::Application;

pub struct ServedShop {
    /// `http://127.0.0.1:PORT`, without a trailing slash.
    pub address: String,
    pub shop: Shop,
    pub server: ServerHandle,
}

impl ServedShop {
    /// Builds the application from `settings` (whose `bind` should name port
    /// 0) and serves it on the current Tokio runtime until stopped.
    pub async fn start(settings: Settings) -> anyhow::Result<ServedShop> {
        let app = Application::build(settings).await?;
        let address = format!("http://127.0.0.1:{}", app.port());
        let shop = app.shop().clone();
        let server = app.handle();
        tokio::spawn(app.run_until_stopped());
        Ok(ServedShop {
            address,
            shop,
            server,
        })
    }
}
