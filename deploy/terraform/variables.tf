# The same inputs as deploy/infra/foundation.yaml's parameters, with the same defaults.

variable "bucket_name" {
  description = "The data bucket (AEGIS_BUCKET)."
  type        = string
  default     = "aegis-bucket-data"
}

variable "table_name" {
  description = "The read-model table (AEGIS_TABLE)."
  type        = string
  default     = "AEGIS-DynamoDB-FactoryStatus"
}

variable "name_prefix" {
  description = "IAM names: policy {name_prefix}-{service}, ECS task role {name_prefix}-{service}-task, execution role {name_prefix}-{task}-execution, {name_prefix}-raw-break-glass, scheduler role {name_prefix}-{task}-scheduler; schedule {name_prefix}-{task}."
  type        = string
  default     = "aegis"

  validation {
    condition     = can(regex("^[a-zA-Z0-9+=,.@_-]{1,32}$", var.name_prefix))
    error_message = "name_prefix must be 1 to 32 of the characters IAM names allow (letters, digits, +=,.@_-)."
  }
}

variable "break_glass_principal" {
  description = "ARN that may assume the raw break-glass role (with MFA); empty: the account."
  type        = string
  default     = ""
}

variable "object_lock_mode" {
  description = "S3 Object Lock default retention for every object of the bucket (only at creation; COMPLIANCE binds administrators too): NONE, GOVERNANCE or COMPLIANCE."
  type        = string
  default     = "NONE"

  validation {
    condition     = contains(["NONE", "GOVERNANCE", "COMPLIANCE"], var.object_lock_mode)
    error_message = "object_lock_mode must be NONE, GOVERNANCE or COMPLIANCE."
  }
}

variable "object_lock_days" {
  description = "Days of Object Lock default retention (when object_lock_mode is not NONE)."
  type        = number
  default     = 365

  validation {
    condition     = var.object_lock_days >= 1 && floor(var.object_lock_days) == var.object_lock_days
    error_message = "object_lock_days must be a whole number of days, at least 1."
  }
}

variable "access_log_bucket_name" {
  description = "A bucket of yours that receives the data bucket's S3 server access logs (it must let logging.s3.amazonaws.com write); empty: none."
  type        = string
  default     = ""
}

variable "ecs_cluster_arn" {
  description = "The ECS cluster the scheduled tasks (deploy/ecs/scheduled: the daily raw seal) run on, started by EventBridge Scheduler; empty: no schedules."
  type        = string
  default     = ""

  validation {
    condition     = var.ecs_cluster_arn == "" || can(regex("^arn:[^:]+:ecs:[^:]+:[0-9]{12}:cluster/[A-Za-z0-9_-]{1,255}$", var.ecs_cluster_arn))
    error_message = "ecs_cluster_arn must be empty or an ECS cluster's ARN (arn:aws:ecs:REGION:ACCOUNT:cluster/NAME)."
  }
}

variable "scheduled_task_subnets" {
  description = "Subnets of the scheduled tasks (awsvpc; they reach S3, e.g. through a gateway endpoint or NAT); at least one when ecs_cluster_arn is given."
  type        = list(string)
  default     = []
}

variable "scheduled_task_security_groups" {
  description = "Security groups of the scheduled tasks (outbound HTTPS only)."
  type        = list(string)
  default     = []
}
