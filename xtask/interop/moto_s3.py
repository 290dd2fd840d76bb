"""An S3 service on loopback for the Opendal(s3) tests: moto's server, in memory.

Prints the endpoint (http://127.0.0.1:PORT) once the bucket named on the command line
exists, then serves until its standard input closes.
"""
import sys

import boto3
from moto.server import ThreadedMotoServer

bucket = sys.argv[1]
server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
server.start()
host, port = server.get_host_and_port()
endpoint = f"http://{host}:{port}"
boto3.client(
    "s3",
    endpoint_url=endpoint,
    region_name="us-east-1",
    aws_access_key_id="test",
    aws_secret_access_key="test",
).create_bucket(Bucket=bucket)
print(endpoint, flush=True)
sys.stdin.read()
server.stop()
