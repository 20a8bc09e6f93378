output "bucket_name" {
  description = "The data bucket (AEGIS_BUCKET)."
  value       = aws_s3_bucket.data.id
}

output "table_arn" {
  description = "The read-model table."
  value       = aws_dynamodb_table.read_model.arn
}

output "table_stream_arn" {
  description = "The read-model table's stream (new and old images)."
  value       = aws_dynamodb_table.read_model.stream_arn
}

output "raw_break_glass_role_arn" {
  description = "The one role that may delete or rewrite raw/ objects (with MFA)."
  value       = aws_iam_role.raw_break_glass.arn
}

output "policy_arns" {
  description = "Each service's least-privilege managed policy, by service (attach to IRSA roles on EKS)."
  value       = { for service, policy in aws_iam_policy.service : service => policy.arn }
}

output "task_role_arns" {
  description = "Each service's ECS task role, by service."
  value       = { for service, role in aws_iam_role.task : service => role.arn }
}

output "execution_role_arns" {
  description = "Each ECS task definition's execution role (the services' and the scheduled tasks'), by name."
  value       = { for service, role in aws_iam_role.execution : service => role.arn }
}

output "repository_urls" {
  description = "Each image's ECR repository, by image."
  value       = { for image, repository in aws_ecr_repository.image : image => repository.repository_url }
}
