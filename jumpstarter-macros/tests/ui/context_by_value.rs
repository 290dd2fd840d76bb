use jumpstarter_macros::driver;

#[allow(dead_code)]
struct Power;

#[driver(client = "jumpstarter_driver_power.client.PowerClient")]
impl Power {
    #[export]
    async fn on(&self, ctx: CallContext) -> Result<(), std::io::Error> {
        Ok(())
    }
}

fn main() {}
