# One least-privilege managed policy and one ECS task role per service (the policy's statements
# are deploy/infra/policies/{service}.json), and the raw break-glass role.

resource "aws_iam_policy" "service" {
  for_each = local.service_policies

  name        = "${var.name_prefix}-${each.key}"
  description = "AEGIS ${each.key}: least privilege (deploy/infra/policies)"
  policy      = jsonencode(jsondecode(each.value))

  lifecycle {
    precondition {
      condition     = length(regexall("[$][{]", each.value)) == 0
      error_message = "deploy/infra/policies/${each.key}.json names a placeholder this module does not replace."
    }
  }
}

resource "aws_iam_role" "task" {
  for_each = local.service_policies

  name               = "${var.name_prefix}-${each.key}-task"
  assume_role_policy = local.ecs_task_trust
}

resource "aws_iam_role_policy_attachment" "task" {
  for_each = local.service_policies

  role       = aws_iam_role.task[each.key].name
  policy_arn = aws_iam_policy.service[each.key].arn
}

# the one role that may delete or rewrite raw/ objects (the bucket policy refuses everyone else):
# one named principal, the account by default, and only with MFA
resource "aws_iam_role" "raw_break_glass" {
  name                 = "${var.name_prefix}-raw-break-glass"
  description          = "AEGIS: the one role that may delete or rewrite raw/ objects"
  max_session_duration = 3600
  assume_role_policy = jsonencode({
    Version = "2012-10-17"
    Statement = [
      {
        Effect    = "Allow"
        Principal = { AWS = coalesce(var.break_glass_principal, "arn:${local.partition}:iam::${local.account_id}:root") }
        Action    = "sts:AssumeRole"
        Condition = { Bool = { "aws:MultiFactorAuthPresent" = "true" } }
      },
    ]
  })
}

resource "aws_iam_role_policy" "raw_break_glass" {
  name   = "raw-break-glass"
  role   = aws_iam_role.raw_break_glass.id
  policy = jsonencode(jsondecode(local.documents["break-glass.json"]))

  lifecycle {
    precondition {
      condition     = length(regexall("[$][{]", local.documents["break-glass.json"])) == 0
      error_message = "deploy/infra/break-glass.json names a placeholder this module does not replace."
    }
  }
}
