# The tasks of deploy/ecs/scheduled (the daily raw seal) on a schedule: given ecs_cluster_arn, per
# task an EventBridge Scheduler schedule at the time of the Kubernetes CronJob of the same name
# (deploy/k8s/base), which starts one Fargate task of the definition's family on that cluster,
# and the role the scheduler takes to do it, which may do exactly that (scheduler-policy.json).
# Without a cluster (the default, e.g. on EKS, where the CronJob runs it) neither is made. The
# tasks' execution roles and log groups are in ecs.tf.

locals {
  k8s_base = "${path.module}/../k8s/base"

  # per scheduled task, the spec of its CronJob (the manifest's documents split at ---)
  cronjobs = {
    for name in local.scheduled_tasks : name => one([
      for manifest in [for document in split("\n---\n", file("${local.k8s_base}/${name}.yaml")) : yamldecode(document)] :
      manifest.spec if manifest.kind == "CronJob"
    ])
  }

  # what each schedule starts, made only when a cluster is given: the definition's family (no
  # revision: the newest ACTIVE one, what register-task-definition made last), its command, the
  # module's roles it names (…:role/aegis-{service}-task, …:role/aegis-{task}-execution), and
  # the CronJob's schedule, "M H * * *", as EventBridge's "cron(M H * * ? *)"
  schedules = {
    for name, cronjob in local.cronjobs : name => {
      family         = local.task_definitions[name].family
      command        = join(" ", local.task_definitions[name].containerDefinitions[0].command)
      task_role      = trimsuffix(trimprefix(basename(local.task_definitions[name].taskRoleArn), "aegis-"), "-task")
      execution_role = trimsuffix(trimprefix(basename(local.task_definitions[name].executionRoleArn), "aegis-"), "-execution")
      cron           = cronjob.schedule
      time_zone      = cronjob.timeZone
      expression     = "cron(${join(" ", slice(split(" ", cronjob.schedule), 0, 2))} * * ? *)"
    } if var.ecs_cluster_arn != ""
  }

  # deploy/infra/scheduler-policy.json per schedule: its task definition's family and the ARNs
  # of the two roles the task is given
  scheduler_policies = {
    for name, schedule in local.schedules : name => replace(replace(replace(local.documents["scheduler-policy.json"],
      "$${Family}", schedule.family),
      "$${TaskRoleArn}", aws_iam_role.task[schedule.task_role].arn),
    "$${ExecutionRoleArn}", aws_iam_role.execution[schedule.execution_role].arn)
  }
}

# trusted by EventBridge Scheduler acting for this account only
resource "aws_iam_role" "scheduler" {
  for_each = local.schedules

  name        = "${var.name_prefix}-${each.key}-scheduler"
  description = "AEGIS: EventBridge Scheduler starts the ${each.key} task, nothing else"
  assume_role_policy = jsonencode({
    Version = "2012-10-17"
    Statement = [
      {
        Effect    = "Allow"
        Principal = { Service = "scheduler.amazonaws.com" }
        Action    = "sts:AssumeRole"
        Condition = { StringEquals = { "aws:SourceAccount" = local.account_id } }
      },
    ]
  })
}

# ecs:RunTask of that family on that cluster, iam:PassRole of its two roles to ECS tasks
resource "aws_iam_role_policy" "scheduler" {
  for_each = local.scheduler_policies

  name   = "run-${each.key}"
  role   = aws_iam_role.scheduler[each.key].id
  policy = jsonencode(jsondecode(each.value))

  lifecycle {
    precondition {
      condition     = length(regexall("[$][{]", each.value)) == 0
      error_message = "deploy/infra/scheduler-policy.json names a placeholder this module does not replace."
    }
  }
}

resource "aws_scheduler_schedule" "task" {
  for_each = local.schedules

  name                         = "${var.name_prefix}-${each.key}"
  description                  = "AEGIS: ${each.value.command}, as the Kubernetes CronJob ${each.key}"
  schedule_expression          = each.value.expression
  schedule_expression_timezone = each.value.time_zone
  state                        = "ENABLED"

  flexible_time_window {
    mode = "OFF"
  }

  target {
    arn      = var.ecs_cluster_arn
    role_arn = aws_iam_role.scheduler[each.key].arn

    # a start that fails is tried again within the hour (the CronJob's startingDeadlineSeconds);
    # a day missed is caught up by the next run's lookback
    retry_policy {
      maximum_retry_attempts       = 3
      maximum_event_age_in_seconds = 3600
    }

    ecs_parameters {
      task_definition_arn = "arn:${local.partition}:ecs:${local.region}:${local.account_id}:task-definition/${each.value.family}"
      launch_type         = "FARGATE"
      platform_version    = "LATEST"
      task_count          = 1

      network_configuration {
        subnets          = var.scheduled_task_subnets
        security_groups  = var.scheduled_task_security_groups
        assign_public_ip = false
      }
    }
  }

  lifecycle {
    precondition {
      condition     = each.value.time_zone == "Etc/UTC" && length(regexall("^[0-9]+ [0-9]+ [*] [*] [*]$", each.value.cron)) == 1
      error_message = "deploy/k8s/base/${each.key}.yaml: only a daily \"M H * * *\" CronJob schedule in Etc/UTC becomes an EventBridge schedule."
    }
    precondition {
      condition     = length(var.scheduled_task_subnets) > 0
      error_message = "scheduled_task_subnets: give the subnets the scheduled tasks run in (at least one) with ecs_cluster_arn."
    }
  }
}
