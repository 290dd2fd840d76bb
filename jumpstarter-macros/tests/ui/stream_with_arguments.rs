use jumpstarter_macros::driver;

#[allow(dead_code)]
struct Serial;

#[driver(client = "jumpstarter_driver_pyserial.client.PySerialClient")]
impl Serial {
    #[export(stream)]
    async fn connect(&self, baud: u32) -> Result<tokio::io::DuplexStream, std::io::Error> {
        todo!()
    }
}

fn main() {}
