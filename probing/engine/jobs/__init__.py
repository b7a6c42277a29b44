"""The whole job: its ranks found from any of its processes (and from other nodes' agents),
asked all at once (fanout), watched for a hang, glanced at."""
