# The read-model table: pk/sk, on demand, the sparse fleet index (keys only), TTL on `ttl`,
# point-in-time recovery and a stream of new and old images, as aegis_storage.bootstrap creates
# it. Kept when the module is destroyed (prevent_destroy).

resource "aws_dynamodb_table" "read_model" {
  name         = var.table_name
  billing_mode = "PAY_PER_REQUEST"
  hash_key     = "pk"
  range_key    = "sk"

  attribute {
    name = "pk"
    type = "S"
  }

  attribute {
    name = "sk"
    type = "S"
  }

  attribute {
    name = "fleet_pk"
    type = "S"
  }

  attribute {
    name = "fleet_sk"
    type = "S"
  }

  global_secondary_index {
    name            = "fleet"
    hash_key        = "fleet_pk"
    range_key       = "fleet_sk"
    projection_type = "KEYS_ONLY"
  }

  ttl {
    attribute_name = "ttl"
    enabled        = true
  }

  point_in_time_recovery {
    enabled = true
  }

  stream_enabled   = true
  stream_view_type = "NEW_AND_OLD_IMAGES"

  lifecycle {
    prevent_destroy = true
  }
}
