# The data bucket: versioned, the lifecycle rules of aegis_storage.bootstrap.LIFECYCLE_RULES,
# no public access, the bucket policy of deploy/infra/bucket-policy.json, optional server access
# logs and Object Lock. Kept when the module is destroyed (CloudFormation's DeletionPolicy:
# Retain): prevent_destroy refuses a plan that would delete it.

resource "aws_s3_bucket" "data" {
  bucket = var.bucket_name
  # Object Lock can only be turned on when the bucket is created
  object_lock_enabled = var.object_lock_mode != "NONE"

  lifecycle {
    prevent_destroy = true
  }
}

resource "aws_s3_bucket_versioning" "data" {
  bucket = aws_s3_bucket.data.id

  versioning_configuration {
    status = "Enabled"
  }
}

resource "aws_s3_bucket_lifecycle_configuration" "data" {
  bucket = aws_s3_bucket.data.id
  # the noncurrent-version rules act on a versioned bucket
  depends_on = [aws_s3_bucket_versioning.data]

  rule {
    id     = "raw-to-glacier-ir-90d"
    status = "Enabled"

    filter {
      prefix = "raw/"
    }

    transition {
      days          = 90
      storage_class = "GLACIER_IR"
    }

    noncurrent_version_expiration {
      noncurrent_days = 90
    }
  }

  rule {
    id     = "processed-to-standard-ia-365d"
    status = "Enabled"

    filter {
      prefix = "processed/"
    }

    transition {
      days          = 365
      storage_class = "STANDARD_IA"
    }

    noncurrent_version_expiration {
      noncurrent_days = 90
    }
  }

  rule {
    id     = "abort-incomplete-multipart-7d"
    status = "Enabled"

    # every key
    filter {}

    abort_incomplete_multipart_upload {
      days_after_initiation = 7
    }
  }

  # the orchestrator's claim checks live as long as the execution log that points at them; the
  # version an expiration turns noncurrent goes a day later, and with it its delete marker
  rule {
    id     = "orchestration-expire-30d"
    status = "Enabled"

    filter {
      prefix = "orchestration/"
    }

    expiration {
      days = 30
    }

    noncurrent_version_expiration {
      noncurrent_days = 1
    }
  }
}

resource "aws_s3_bucket_public_access_block" "data" {
  bucket = aws_s3_bucket.data.id

  block_public_acls       = true
  ignore_public_acls      = true
  block_public_policy     = true
  restrict_public_buckets = true
}

# below every role: raw/ is written only where nothing is, and deleted by nobody but the
# break-glass role; incident and audit records are written once
resource "aws_s3_bucket_policy" "data" {
  bucket     = aws_s3_bucket.data.id
  policy     = jsonencode(jsondecode(local.documents["bucket-policy.json"]))
  depends_on = [aws_s3_bucket_public_access_block.data]

  lifecycle {
    precondition {
      condition     = length(regexall("[$][{]", local.documents["bucket-policy.json"])) == 0
      error_message = "deploy/infra/bucket-policy.json names a placeholder this module does not replace."
    }
  }
}

# S3 server access logs: every request to the bucket (who, what key, when, the answer), delivered
# to a bucket of the operator's (a bucket must not log into itself)
resource "aws_s3_bucket_logging" "data" {
  count = var.access_log_bucket_name != "" ? 1 : 0

  bucket        = aws_s3_bucket.data.id
  target_bucket = var.access_log_bucket_name
  target_prefix = "${var.bucket_name}/"
}

resource "aws_s3_bucket_object_lock_configuration" "data" {
  count = var.object_lock_mode != "NONE" ? 1 : 0

  bucket     = aws_s3_bucket.data.id
  depends_on = [aws_s3_bucket_versioning.data]

  rule {
    default_retention {
      mode = var.object_lock_mode
      days = var.object_lock_days
    }
  }
}
