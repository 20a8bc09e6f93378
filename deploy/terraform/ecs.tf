# Per ECS task definition of deploy/ecs, and of deploy/ecs/scheduled (the tasks EventBridge
# Scheduler starts, scheduled.tf): its log group, its execution role (pull the image, write the
# log group, read exactly the secrets the definition names); and an image repository per service
# and for the one-shot images (cli, storage-tools). The task roles are in iam.tf.

locals {
  ecs             = "${path.module}/../ecs"
  ecs_services    = toset([for f in fileset(local.ecs, "*.json") : trimsuffix(f, ".json")])
  scheduled_tasks = toset([for f in fileset("${local.ecs}/scheduled", "*.json") : trimsuffix(f, ".json")])
  # every task definition by name, decoded: the services' and the scheduled tasks'
  task_definitions = merge(
    { for name in local.ecs_services : name => jsondecode(file("${local.ecs}/${name}.json")) },
    { for name in local.scheduled_tasks : name => jsondecode(file("${local.ecs}/scheduled/${name}.json")) },
  )
  # the images of one-shot work beside the services (`aegis streams`, `aegis bootstrap`,
  # `aegis seal raw`, migrations) get repositories too; a scheduled task runs one of those
  images = setunion(local.ecs_services, ["cli", "storage-tools"])

  # what each task reads at start (its secrets' valueFrom) as IAM resources: a Secrets Manager
  # secret by name (its ARN ends in a random suffix, and a JSON key may follow), an SSM parameter
  # as is; the task definitions' envsubst placeholders replaced
  task_secrets = {
    for service, task in local.task_definitions : service => sort(distinct([
      for arn in flatten([
        for container in task.containerDefinitions :
        [for secret in try(container.secrets, []) : secret.valueFrom]
      ]) :
      replace(replace(replace(
        strcontains(arn, ":secretsmanager:") ? "${join(":", slice(split(":", arn), 0, 7))}-*" : arn,
        "$${AWS_REGION}", local.region),
        "$${AWS_ACCOUNT_ID}", local.account_id),
      "/^arn:aws:/", "arn:${local.partition}:")
    ]))
  }
  execution_statements = {
    for service, arns in local.task_secrets : service => concat(
      [for found in [[for arn in arns : arn if strcontains(arn, ":secretsmanager:")]] :
      { Effect = "Allow", Action = "secretsmanager:GetSecretValue", Resource = found } if length(found) > 0],
      [for found in [[for arn in arns : arn if strcontains(arn, ":ssm:")]] :
      { Effect = "Allow", Action = "ssm:GetParameters", Resource = found } if length(found) > 0],
    )
  }
}

# tags never move (a deployment names one build), and every push is scanned
resource "aws_ecr_repository" "image" {
  for_each = local.images

  name                 = "aegis-${each.key}"
  image_tag_mutability = "IMMUTABLE"

  image_scanning_configuration {
    scan_on_push = true
  }

  lifecycle {
    prevent_destroy = true
  }
}

resource "aws_cloudwatch_log_group" "service" {
  for_each = local.task_definitions

  name              = "/aegis/${each.key}"
  retention_in_days = 30

  lifecycle {
    prevent_destroy = true
  }
}

resource "aws_iam_role" "execution" {
  for_each = local.task_definitions

  name               = "${var.name_prefix}-${each.key}-execution"
  assume_role_policy = local.ecs_task_trust
}

resource "aws_iam_role_policy_attachment" "execution" {
  for_each = local.task_definitions

  role       = aws_iam_role.execution[each.key].name
  policy_arn = "arn:${local.partition}:iam::aws:policy/service-role/AmazonECSTaskExecutionRolePolicy"
}

resource "aws_iam_role_policy" "read_its_secrets" {
  for_each = { for service, statements in local.execution_statements : service => statements if length(statements) > 0 }

  name   = "read-its-secrets"
  role   = aws_iam_role.execution[each.key].id
  policy = jsonencode({ Version = "2012-10-17", Statement = each.value })
}
