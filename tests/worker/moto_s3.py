"""An S3 server on 127.0.0.1 for the fetch tests: moto's server mode with authentication on (a wrong
key or secret is refused as AWS refuses it), one IAM user whose access key it prints, and a bucket
seeded with boto3 (large objects as multipart uploads, as `aws s3 cp` makes them). Run with
.venv/s3-tools on PYTHONPATH (moto and boto3 live there: see the Makefile); it prints one JSON line
(port, key, secret) and serves until its standard input closes. Each line it reads meanwhile is a
change made to the store, answered with one JSON line (so that a test can move objects under a
fetch): {"op": "bucket", "bucket": B, "versioned": bool}, {"op": "seed", "bucket": B, "prefix": P,
"dir": D}, {"op": "put", "bucket": B, "key": K, "text": T} (answers its ETag and VersionId),
{"op": "delete", "bucket": B, "key": K}.

    python -P moto_s3.py BUCKET PREFIX=DIR [PREFIX=DIR ...]
"""

import json
import os
import sys
from pathlib import Path

# Requests before authentication starts: the IAM user, its key and its policy are made unsigned.
os.environ["INITIAL_NO_AUTH_ACTION_COUNT"] = "3"

import boto3
from boto3.s3.transfer import TransferConfig
from moto.server import ThreadedMotoServer

ALLOW_S3 = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}
PART_BYTES = 8 << 20  # the CLI's default part size: model.safetensors (87 MiB) is 11 parts


def main() -> None:
    bucket, seeds = sys.argv[1], [arg.split("=", 1) for arg in sys.argv[2:]]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    anonymous = {
        "endpoint_url": url,
        "region_name": "us-east-1",
        "aws_access_key_id": "x",
        "aws_secret_access_key": "x",
    }
    iam = boto3.client("iam", **anonymous)
    iam.create_user(UserName="fetch")
    key = iam.create_access_key(UserName="fetch")["AccessKey"]
    iam.put_user_policy(UserName="fetch", PolicyName="s3", PolicyDocument=json.dumps(ALLOW_S3))
    s3 = boto3.client(
        "s3",
        **anonymous
        | {"aws_access_key_id": key["AccessKeyId"], "aws_secret_access_key": key["SecretAccessKey"]},
    )
    s3.create_bucket(Bucket=bucket)
    for prefix, directory in seeds:
        seed(s3, bucket, prefix, directory)
    print(
        json.dumps(
            {
                "port": server.get_host_and_port()[1],
                "key": key["AccessKeyId"],
                "secret": key["SecretAccessKey"],
            }
        ),
        flush=True,
    )
    for line in sys.stdin:
        print(json.dumps(change(s3, json.loads(line))), flush=True)
    server.stop()


def seed(s3, bucket: str, prefix: str, directory: str) -> None:
    transfer = TransferConfig(multipart_threshold=PART_BYTES, multipart_chunksize=PART_BYTES)
    for path in sorted(Path(directory).rglob("*")):
        if path.is_file():
            name = f"{prefix.strip('/')}/{path.relative_to(directory)}"
            s3.upload_file(str(path), bucket, name, Config=transfer)


def change(s3, command: dict) -> dict:
    op, bucket = command["op"], command["bucket"]
    if op == "bucket":
        s3.create_bucket(Bucket=bucket)
        if command.get("versioned"):
            s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    elif op == "seed":
        seed(s3, bucket, command["prefix"], command["dir"])
    elif op == "put":
        put = s3.put_object(Bucket=bucket, Key=command["key"], Body=command["text"].encode())
        return {"etag": put["ETag"], "version": put.get("VersionId", "")}
    elif op == "delete":
        s3.delete_object(Bucket=bucket, Key=command["key"])
    return {}


if __name__ == "__main__":
    main()
