# The AEGIS foundation in Terraform: the data bucket, the read-model table (what `aegis bootstrap`
# creates), one least-privilege managed policy and ECS task role per service, the raw break-glass
# role, per ECS task definition its log group and execution role, image repositories, and, given
# an ECS cluster, the EventBridge Scheduler schedule of each scheduled task with the role it takes
# (scheduled.tf). The same resources, names and settings as deploy/infra/foundation.yaml;
# tests/integration/test_terraform.py compares the two resource by resource.
#
# The IAM documents are not copied here: they are read from deploy/infra (policies/*.json,
# bucket-policy.json, break-glass.json, scheduler-policy.json), the one place they are written,
# with their ${...} placeholders (CloudFormation's Fn::Sub names) replaced below.

data "aws_partition" "current" {}
data "aws_region" "current" {}
data "aws_caller_identity" "current" {}

locals {
  partition  = data.aws_partition.current.partition
  region     = data.aws_region.current.name
  account_id = data.aws_caller_identity.current.account_id

  infra = "${path.module}/../infra"

  # deploy/infra's JSON documents, keyed by their path under deploy/infra, each placeholder
  # replaced by its value here
  documents = {
    for path in concat(tolist(fileset(local.infra, "policies/*.json")), ["bucket-policy.json", "break-glass.json", "scheduler-policy.json"]) :
    path => replace(replace(replace(replace(replace(replace(replace(file("${local.infra}/${path}"),
      "$${AWS::Partition}", local.partition),
      "$${AWS::Region}", local.region),
      "$${AWS::AccountId}", local.account_id),
      "$${BucketName}", var.bucket_name),
      "$${TableName}", var.table_name),
      "$${NamePrefix}", var.name_prefix),
    "$${EcsClusterArn}", var.ecs_cluster_arn)
  }

  # one least-privilege policy per file of deploy/infra/policies, named after it
  service_policies = {
    for path in fileset(local.infra, "policies/*.json") : trimsuffix(basename(path), ".json") => local.documents[path]
  }

  # ECS task roles (on EKS, attach the policies to IRSA roles instead)
  ecs_task_trust = jsonencode({
    Version = "2012-10-17"
    Statement = [
      {
        Effect    = "Allow"
        Principal = { Service = "ecs-tasks.amazonaws.com" }
        Action    = "sts:AssumeRole"
      },
    ]
  })
}
